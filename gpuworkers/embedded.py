"""The embedded worker: one engine thread inside the web process.

In embedded mode (no Redis) the process's set-up (``config.embedded``)
starts a ``WorkerLoop`` in a daemon thread on the in-process bus that the
web tier uses too; later callers find it running. Start-up is once per
process and thread-safe; a failed start is remembered, so requests get a
clear 503 instead of reloading the model each time.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gpuworkers.worker import WorkerLoop
from wire.bus import memory_bus

logger = logging.getLogger(__name__)

_lock = threading.Lock()
_worker: EmbeddedWorker | None = None


@dataclass(slots=True, frozen=True)
class EmbeddedSpec:
    """What the embedded worker serves and how to build its engine."""

    model_name: str
    # Builds the engine; called once, in the engine thread (loading takes a while).
    load_engine: Callable[[], Any]
    # The GPU price per hour reported for cost accounting (a decimal string).
    hourly_price: str = "0"


class EmbeddedWorker:
    """The engine thread and what the web tier needs to know about it."""

    def __init__(self, spec: EmbeddedSpec) -> None:
        self.spec = spec
        self.worker_id = f"embedded-{socket.gethostname()}-{os.getpid()}"
        self.model_name = spec.model_name
        self.loop: WorkerLoop | None = None
        self.error: BaseException | None = None
        self.ready = threading.Event()
        self.thread = threading.Thread(target=self._run, name="embedded-engine", daemon=True)

    def wait_ready(self, timeout: float | None = None) -> bool:
        """Block until the engine serves (or failed to start); True if serving."""
        self.ready.wait(timeout)
        return self.ready.is_set() and self.error is None

    def _run(self) -> None:
        try:
            logger.info("embedded engine: loading %s", self.model_name)
            engine = self.spec.load_engine()
            self.loop = WorkerLoop(
                engine,
                # Pinned: the web tier must keep finding the bus this worker serves.
                memory_bus(pin=True),
                self.worker_id,
                self.model_name,
                hourly_price=self.spec.hourly_price,
            )
            waiter = threading.Thread(target=self._mark_ready, daemon=True)
            waiter.start()
            self.loop.run()
        except BaseException as exc:
            logger.exception("embedded engine stopped")
            self.error = exc
        finally:
            self.ready.set()

    def _mark_ready(self) -> None:
        assert self.loop is not None
        self.loop.ready.wait()
        if self.loop.stopped.is_set() and self.error is None:
            self.error = RuntimeError("the embedded engine stopped while warming up")
        self.ready.set()
        logger.info("embedded engine ready: %s", self.worker_id)


def ensure_started(spec: Callable[[], EmbeddedSpec]) -> EmbeddedWorker:
    """The process's embedded worker, started on first call from ``spec()``."""
    global _worker
    with _lock:
        if _worker is None:
            _worker = EmbeddedWorker(spec())
            _worker.thread.start()
        return _worker


def current() -> EmbeddedWorker | None:
    """The embedded worker if one was started, without starting it."""
    return _worker


def stop(timeout: float = 60.0) -> None:
    """Stop the process's embedded worker, if one was started, and forget it.

    The worker deregisters from the bus as it stops, so nothing routes to
    it any more; the next ``ensure_started`` starts a fresh one. Tests that
    start it call this when they are done, so later tests' workers do not
    compete with it on the pinned in-process bus.
    """
    global _worker
    with _lock:
        worker, _worker = _worker, None
    if worker is None:
        return
    worker.ready.wait(timeout)  # still loading: the loop does not exist yet
    if worker.loop is not None:
        worker.loop.request_stop()
    worker.thread.join(timeout)
