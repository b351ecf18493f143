"""A real WorkerLoop around a test's engine, serving in a thread.

The fixtures that put the demo engine behind the configured bus (API tests
through the SDK, tracing, safety cuts, settlement) share this one loop.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

from gpuworkers.worker import WorkerLoop
from wire.bus import get_worker_bus


@contextmanager
def serving_worker(engine, model: str, name: str) -> Iterator[WorkerLoop]:
    """``engine`` serving ``model`` as worker ``name-<random>`` until the block ends."""
    loop = WorkerLoop(engine, get_worker_bus(), f"{name}-{uuid.uuid4().hex[:6]}", model)
    thread = threading.Thread(target=loop.run, daemon=True)
    thread.start()
    assert loop.ready.wait(60) and not loop.stopped.is_set()
    try:
        yield loop
    finally:
        loop.request_stop()
        thread.join(30)
