"""The worker's signs of life, each from a thread of its own.

The heartbeat (the registry's ``WorkerInfo``: state, load, stats) goes out
every ``interval`` seconds; the liveness key, the web tier's death signal,
every ``LIVENESS_INTERVAL``. Neither runs on the engine's thread, so a long
step never looks like a dead worker. Also here: the token rate the
heartbeat reports.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable

from wire import logs
from wire.bus import BusUnavailable, WorkerBus
from wire.bus.base import LIVENESS_INTERVAL
from wire.workers import WorkerInfo

logger = logging.getLogger(__name__)

# Seconds of samples the token rate averages over.
RATE_WINDOW = 10.0


class Beats:
    """The heartbeat and liveness threads of one worker.

    Args:
        bus: the worker side of the bus.
        worker_id: the registry key.
        model_name: bound in the heartbeat thread's log context.
        info: the heartbeat's payload, built from the loop's latest stats
            snapshot (never the engine itself: it belongs to another thread).
        interval: seconds between heartbeats.
    """

    def __init__(
        self,
        bus: WorkerBus,
        worker_id: str,
        model_name: str,
        info: Callable[[], WorkerInfo],
        interval: float,
    ):
        self.bus = bus
        self.worker_id = worker_id
        self.model_name = model_name
        self.info = info
        self.interval = interval
        self._stop = threading.Event()
        self._threads = [
            threading.Thread(target=loop, name=f"{name}-{worker_id}", daemon=True)
            for name, loop in (("heartbeat", self._heartbeat_loop), ("live", self._live_loop))
        ]

    def start(self) -> None:
        for thread in self._threads:
            thread.start()

    def stop(self) -> None:
        """Stop both threads and wait for them (never started: nothing to wait for)."""
        self._stop.set()
        for thread in self._threads:
            if thread.is_alive():
                thread.join(timeout=self.interval + 5)

    def _live_loop(self) -> None:
        # Never the engine thread, and nothing but one SET: a long step or a
        # slow heartbeat (its JSON, its pipeline) cannot delay it.
        while not self._stop.wait(LIVENESS_INTERVAL):
            try:
                self.bus.liveness(self.worker_id)
            except BusUnavailable:
                pass  # logged by the loop; the next refresh retries
            except Exception:
                logger.exception("worker %s: liveness refresh failed", self.worker_id)

    def _heartbeat_loop(self) -> None:
        logs.bind(worker=self.worker_id, model=self.model_name)
        while not self._stop.wait(self.interval):
            try:
                self.bus.heartbeat(self.info())
            except BusUnavailable:
                pass  # logged by the loop; the next beat retries
            except Exception:
                logger.exception("worker %s: heartbeat failed", self.worker_id)


class TokenRate:
    """Generated tokens per second over the last ``RATE_WINDOW`` seconds."""

    __slots__ = ("_samples",)

    def __init__(self) -> None:
        self._samples: deque[tuple[float, int]] = deque()

    def add(self, now: float, generated: int) -> float:
        """Record the engine's token counter at ``now``; returns the rate."""
        samples = self._samples
        samples.append((now, generated))
        while len(samples) > 2 and now - samples[0][0] > RATE_WINDOW:
            samples.popleft()
        span = now - samples[0][0]
        rate = (generated - samples[0][1]) / span if span > 0 else 0.0
        return round(max(rate, 0.0), 2)
