"""The embedded worker: one engine thread inside the web process.

With settings.EMBEDDED_ENGINE (the default without Redis) the first request
starts a ``WorkerLoop`` in a daemon thread on the same bus the web tier
uses, loading the demo model; later requests find it running. Start-up is
once per process and thread-safe; a failed start is remembered, so requests
get a clear 503 instead of reloading the model each time.
"""

from __future__ import annotations

import logging
import os
import socket
import threading

from django.conf import settings

from gpuworkers.scheduling import engine_scheduling_options
from gpuworkers.worker import WorkerLoop
from inference.bus import get_worker_bus

logger = logging.getLogger(__name__)

_lock = threading.Lock()
_worker: EmbeddedWorker | None = None


class EmbeddedWorker:
    """The engine thread and what the web tier needs to know about it."""

    def __init__(self) -> None:
        self.worker_id = f"embedded-{socket.gethostname()}-{os.getpid()}"
        self.model_name = settings.DEMO_MODEL_NAME
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
            engine = self._load_engine()
            self.loop = WorkerLoop(
                engine,
                get_worker_bus(),
                self.worker_id,
                self.model_name,
                hourly_price=settings.WORKER_HOURLY_PRICE,
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

    def _load_engine(self):
        from gpuworkers.engine import LLMEngine
        from gpuworkers.engine.convert_gguf import ensure_demo_model

        if settings.ENGINE_THREADS:
            import torch

            torch.set_num_threads(settings.ENGINE_THREADS)
        logger.info("embedded engine: loading %s", self.model_name)
        return LLMEngine.from_pretrained(
            ensure_demo_model(),
            dtype=settings.ENGINE_DTYPE,
            kv_cache_bytes=settings.ENGINE_KV_CACHE_MB << 20,
            max_num_batched_tokens=settings.ENGINE_MAX_BATCHED_TOKENS,
            model_id=self.model_name,
            **engine_scheduling_options(),
        )


def ensure_started() -> EmbeddedWorker:
    """The process's embedded worker, started on first call."""
    global _worker
    with _lock:
        if _worker is None:
            _worker = EmbeddedWorker()
            _worker.thread.start()
        return _worker


def current() -> EmbeddedWorker | None:
    """The embedded worker if one was started, without starting it."""
    return _worker
