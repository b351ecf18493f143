"""The worker loop: bus in, engine step, events out.

One thread owns the engine (it is not thread-safe) and runs ``WorkerLoop``:
poll the bus for new requests and aborts, run one ``engine.step()``, turn
its outputs into events and publish them in one round trip. A second thread
sends the heartbeat once a second from a stats snapshot the loop refreshes;
a third refreshes the liveness key every ``LIVENESS_INTERVAL`` (the web
tier's death signal), so a long step never looks like a dead worker (both
in ``gpuworkers.heartbeat``).
Nothing here touches the database: the request path is bus, engine, bus.

Intake: a request polled stays pending on the bus until its ``created``
event is published (or it ended), then it is acked, after the iteration's
engine step (no Redis round trip before the prefill); a worker that dies
before ``created`` leaves it to a peer of the model (``wire.bus``). Draining
(SIGTERM): the inbox is closed to new requests (peers take what is queued
there), running ones finish within ``drain_seconds``, what is left then
ends ``failed`` (``worker_shutdown``); requests that no live peer can take
end ``failed`` (``worker_draining``).

The same stats snapshot feeds the worker's Prometheus metrics
(``gpuworkers.metrics``); both threads log with the worker and model bound
(``wire.logs``).
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
from typing import Any

from gpuworkers.heartbeat import Beats, TokenRate
from gpuworkers.metrics import WorkerMetrics
from gpuworkers.sampling import sampling_params
from gpuworkers.scheduling import request_scheduling
from gpuworkers.tracker import ResponseTracker
from wire import logs
from wire.bus import BusUnavailable, WorkerBus
from wire.events import ErrorInfo
from wire.requests import GenerationRequest
from wire.tracing import tracing_enabled
from wire.workers import WorkerInfo, WorkerState

logger = logging.getLogger(__name__)

# Poll timeouts: idle, wait for work; busy, only take what is already there.
IDLE_BLOCK_MS = 500
BUSY_BLOCK_MS = 0
HEARTBEAT_INTERVAL = 1.0
# Seconds a draining worker lets running requests finish (WORKER_DRAIN_SECONDS).
DRAIN_SECONDS = 30.0
# Consecutive failing steps after which the engine is considered broken.
MAX_STEP_FAILURES = 5
ENGINE_ERROR = ErrorInfo("The inference engine failed on this request", code="engine_error")
DRAINING_ERROR = ErrorInfo("The worker is shutting down; retry the request", code="worker_draining")
SHUTDOWN_ERROR = ErrorInfo("The worker was shut down", code="worker_shutdown")


def request_error(message: str) -> ErrorInfo:
    """The ending of a request whose own processing failed in the engine."""
    return ErrorInfo(
        f"The inference engine failed on this request ({message})", code="engine_error"
    )


class EngineBroken(RuntimeError):
    """engine.step() keeps failing; the process should exit and be restarted."""


class WorkerLoop:
    """Serve one engine from one bus until stopped.

    Args:
        engine: an ``LLMEngine`` (or anything with its request API).
        bus: the worker side of the bus.
        worker_id: unique per process; the registry key.
        model_name: the served model's name (``GenerationRequest.model``).
        version: the deployment's model version, reported in the heartbeat.
        hourly_price: what this deployment's GPU costs per hour (a decimal
            string), reported with the busy/idle seconds for cost accounting.
        drain_seconds: how long running requests may take to finish once
            draining; then they end ``failed``.
    """

    def __init__(
        self,
        engine: Any,
        bus: WorkerBus,
        worker_id: str,
        model_name: str,
        *,
        heartbeat_interval: float = HEARTBEAT_INTERVAL,
        idle_block_ms: int = IDLE_BLOCK_MS,
        version: str = "",
        hourly_price: str = "0",
        drain_seconds: float = DRAIN_SECONDS,
    ):
        self.engine = engine
        self.bus = bus
        self.worker_id = worker_id
        self.model_name = model_name
        self.version = version
        self.heartbeat_interval = heartbeat_interval
        self.idle_block_ms = idle_block_ms
        self.state = WorkerState.WARMING
        self.metrics = WorkerMetrics(model_name, max_model_len=engine.max_model_len)
        config = engine.config
        self.metrics.cache_config(
            {
                "block_size": config.block_size,
                "cache_dtype": config.cache_dtype,
                "enable_prefix_caching": config.enable_prefix_caching,
                "num_gpu_blocks": config.num_kv_blocks,
                "num_cpu_blocks": config.num_host_blocks,
            }
        )
        self.tracker = ResponseTracker(
            worker_id=worker_id,
            model=model_name,
            tokenizer=getattr(engine, "tokenizer", None),
            metrics=self.metrics,
            version=version,
        )
        self.ready = threading.Event()
        # Set once the loop has left and deregistered.
        self.stopped = threading.Event()
        self._drain = threading.Event()
        self._force = threading.Event()
        self.drain_seconds = drain_seconds
        self._drain_deadline = float("inf")
        self._inbox_closed = False
        # Polled, not yet acked (an ack that failed is retried next round).
        self._unacked: list[str] = []
        self._stats: dict[str, Any] = {}
        self._stats_at = 0.0
        self._rate = TokenRate()
        self._step_failures = 0
        self._bus_down_logged = False
        self._extra = {"pid": os.getpid(), "host": socket.gethostname()}
        # GPU accounting (billing.services.gpu): cumulative seconds since
        # this process started; boot_id tells a restart from a counter reset.
        self._extra.update(hourly_price=str(hourly_price), boot_id=uuid.uuid4().hex)
        self.busy_seconds = 0.0
        self.idle_seconds = 0.0

    # -- lifecycle ------------------------------------------------------------

    def run(self) -> None:
        """Register, warm up, serve until drained or stopped, deregister."""
        beats = Beats(self.bus, self.worker_id, self.model_name, self.info, self.heartbeat_interval)
        logs.bind(worker=self.worker_id, model=self.model_name)
        try:
            self._refresh_stats(force=True)
            self.bus.register(self.info())
            beats.start()
            seconds = self.engine.warmup()
            logger.info("worker %s warmed up in %.1fs", self.worker_id, seconds)
            if not self._drain.is_set():  # a signal during warm-up wins
                self.state = WorkerState.READY
            # Warm-up's tokens and steps are not served traffic.
            self.metrics.restart_counting()
            self._refresh_stats(force=True)
            self.bus.heartbeat(self.info())
            self.ready.set()
            while not self._finished():
                self.run_once()
            if self._force.is_set():
                self._fail_all(SHUTDOWN_ERROR)
            self._hand_back()
        finally:
            # The beats must be gone first, or they could re-register us.
            beats.stop()
            try:
                self.bus.deregister(self.worker_id)
            except BusUnavailable:
                logger.warning("worker %s: could not deregister, bus down", self.worker_id)
            self.stopped.set()
            self.ready.set()  # nobody waits forever on a worker that died warming

    def request_drain(self) -> None:
        """Stop taking requests, finish running ones, then leave (SIGTERM).

        Safe in a signal handler: the loop thread does the bus calls.
        """
        if not self._drain.is_set():
            self._drain_deadline = time.monotonic() + self.drain_seconds
        self.state = WorkerState.DRAINING
        self._drain.set()

    def request_stop(self) -> None:
        """Leave now; in-flight requests end with ``failed`` (second signal)."""
        self.request_drain()
        self._force.set()

    def _finished(self) -> bool:
        if self._drain.is_set() and time.monotonic() >= self._drain_deadline:
            logger.warning("worker %s: drain deadline passed", self.worker_id)
            self._force.set()
        if self._force.is_set():
            return True
        return self._drain.is_set() and not self.tracker.active

    def _hand_back(self) -> None:
        """Leaving: queued requests go to live peers, or end ``worker_draining``."""
        try:
            left = self.bus.hand_back(self.worker_id)
        except BusUnavailable:
            left = []
        for request in left:
            self.metrics.refused("draining")
            self.tracker.reject(request, DRAINING_ERROR)
        self._flush()
        self._unacked += [r.response_id for r in left]
        self._ack()

    # -- one iteration ----------------------------------------------------------

    def run_once(self) -> None:
        """Poll, admit, abort, step, publish: one engine iteration."""
        started = time.monotonic()
        if self._drain.is_set() and not self._inbox_closed:
            self._close_inbox()
        busy = self.engine.has_unfinished_requests()
        requests, aborts = self._poll(BUSY_BLOCK_MS if busy else self.idle_block_ms, busy)
        polled = time.monotonic()
        for request in requests:
            self._admit(request)
        if requests:
            # ``created`` goes out now, not after a possibly long prefill step.
            self._flush()
            # Started: from now on no other worker may run them (a peer that
            # reclaims one sees its response stream and drops it).
            self._unacked += [r.response_id for r in requests]
        for response_id in aborts:
            if response_id in self.tracker.active:
                self.engine.abort(response_id)
        stepped = self.engine.has_unfinished_requests()
        if stepped:
            self._step()
        self._flush()
        # After the step: a round trip to Redis less between a request's
        # intake and its prefill (its first token), and the ack still
        # follows its ``created``.
        self._ack()
        # Waiting for work is idle time; polling between steps and the step
        # itself are busy time.
        poll_s, rest_s = polled - started, time.monotonic() - polled
        self.busy_seconds += (poll_s if busy else 0.0) + (rest_s if stepped else 0.0)
        self.idle_seconds += (0.0 if busy else poll_s) + (0.0 if stepped else rest_s)
        self._refresh_stats()

    def _close_inbox(self) -> None:
        try:
            self.bus.close_inbox(self.worker_id)
            self._inbox_closed = True
        except BusUnavailable:
            pass  # logged by the poll; retried next iteration

    def _ack(self) -> None:
        if not self._unacked:
            return
        try:
            self.bus.ack(self.worker_id, self._unacked)
            self._unacked = []
        except BusUnavailable:
            pass  # still pending: retried next iteration

    def _poll(self, block_ms: int, busy: bool) -> tuple[list[GenerationRequest], list[str]]:
        try:
            accept = not self._drain.is_set()
            polled = self.bus.poll(self.worker_id, block_ms, accept=accept)
        except BusUnavailable as exc:
            if not self._bus_down_logged:
                logger.error("worker %s: bus unavailable: %s", self.worker_id, exc)
                self._bus_down_logged = True
            if not busy:
                time.sleep(0.5)
            return [], []
        self._bus_down_logged = False
        return polled

    def _admit(self, request: GenerationRequest) -> None:
        # Polled before a drain began: served like the running ones.
        self.tracker.open(request)
        try:
            params = sampling_params(request.sampling)
            self.engine.add_request(
                request.response_id,
                list(request.prompt_token_ids),
                params,
                cache_salt=request.cache_salt,
                **request_scheduling(request),
            )
        except (ValueError, TypeError) as exc:
            # The API validates first; this is the engine's last word.
            error = ErrorInfo(
                str(exc), type="invalid_request_error", param=getattr(exc, "param", None)
            )
            self.metrics.refused("invalid")
            self.tracker.fail(request.response_id, error)

    def _step(self) -> None:
        started = time.time()
        engine = self.engine
        # The step's prompt plus generated tokens (vllm:iteration_tokens_total).
        tokens_before = engine.prompt_tokens_computed + engine.generated_tokens
        try:
            outputs = engine.step()
        except Exception:
            logger.exception("worker %s: engine step failed", self.worker_id)
            self._step_failures += 1
            self._fail_all(ENGINE_ERROR)
            if self._step_failures >= MAX_STEP_FAILURES:
                raise EngineBroken(f"{self._step_failures} engine steps failed in a row") from None
            return
        if engine.last_step_failed:
            # A batch of one request failed: that request alone ends (below),
            # but a device that fails every request fails step after step.
            self._step_failures += 1
            if self._step_failures >= MAX_STEP_FAILURES:
                self._fail_all(ENGINE_ERROR)
                raise EngineBroken(f"{self._step_failures} engine steps failed in a row")
        else:
            self._step_failures = 0
        self.metrics.iteration(
            engine.prompt_tokens_computed + engine.generated_tokens - tokens_before
        )
        # Requests whose own processing raised: the engine freed their KV
        # blocks and went on with the others.
        for response_id, message in self.engine.take_failures():
            self.tracker.fail(response_id, request_error(message))
        if tracing_enabled():
            self.tracker.on_prefill_chunks(self.engine.last_prefill_chunks, started, time.time())
        for output in outputs:
            self.tracker.on_output(output)

    def _fail_all(self, error: ErrorInfo) -> None:
        """End every in-flight response with ``failed`` and drop it from the engine."""
        for response_id in list(self.tracker.active):
            self.tracker.fail(response_id, error)
            try:
                self.engine.abort(response_id)
            except Exception:
                logger.exception("worker %s: abort of %s failed", self.worker_id, response_id)
        self._flush()

    def _flush(self) -> None:
        batch = self.tracker.take_batch()
        if not batch:
            return
        try:
            closed = self.bus.publish_many(batch)
        except BusUnavailable:
            # These events are lost, so their streams are broken: the web tier
            # fails them on its side; stop spending compute on them.
            closed = {response_id for response_id, _ in batch}
            logger.error("worker %s: bus down, dropping %d streams", self.worker_id, len(closed))
        for response_id in closed:
            # Someone else ended the stream (worker presumed lost, reader gave up).
            if self.tracker.forget(response_id):
                self.engine.abort(response_id)

    # -- the heartbeat's payload --------------------------------------------------

    def info(self) -> WorkerInfo:
        stats = self._stats
        return WorkerInfo(
            worker_id=self.worker_id,
            model=self.model_name,
            state=self.state,
            version=self.version,
            running=stats.get("running", 0),
            waiting=stats.get("waiting", 0),
            swapped=stats.get("swapped", 0),
            kv_blocks_used=stats.get("kv_blocks_used", 0),
            kv_blocks_total=stats.get("kv_blocks_total", 0),
            queued_tokens=stats.get("queued_prompt_tokens", 0),
            tokens_per_second=stats.get("tokens_per_second", 0.0),
            extra={**self._extra, **stats, "max_model_len": self.engine.max_model_len},
        )

    def _refresh_stats(self, *, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self._stats_at < 0.1:
            return
        stats = dict(self.engine.stats())
        stats["tokens_per_second"] = self._rate.add(now, stats.get("generated_tokens", 0))
        # The autoscaling signal's queue age (fleet.autoscale): the oldest
        # request still waiting for its first token.
        waiting_since = [
            r.request.created_at for r in self.tracker.active.values() if r.first_token_at is None
        ]
        stats["queue_age_seconds"] = (
            round(max(time.time() - min(waiting_since), 0.0), 3) if waiting_since else 0.0
        )
        stats["busy_seconds"] = round(self.busy_seconds, 3)
        stats["idle_seconds"] = round(self.idle_seconds, 3)
        self.metrics.observe_stats(stats, self.tracker.active.values())
        # One reference swap: the heartbeat thread never sees a half-built dict.
        self._stats = stats
        self._stats_at = now
