"""Engine fixtures: the real demo model, and worker loops serving it.

The engine is loaded once per module (dtype "auto": bfloat16 where the CPU
computes in it, float32 on AVX2-only CPUs; a small KV pool and step budget
so warm-up stays about a second); ``serve`` runs a ``WorkerLoop`` on
it over a chosen bus and stops it after the test; ``demo_worker`` serves it
as the demo model on the configured bus (the request path's tests).
torch and the engine are imported by the fixtures, not by this plugin, so
a test run that needs no engine never loads them.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.plugins.request_path import DEMO
from tests.wire.bus.buses import uid
from tokenization import apply_chat_template

MODEL = "demo-test"


@pytest.fixture(scope="session")
def demo_dir() -> Path:
    """The converted demo model's directory (converted on first use)."""
    from gpuworkers.engine.convert_gguf import ensure_demo_model

    return ensure_demo_model()


@pytest.fixture(scope="module")
def engine(demo_dir):
    import torch

    from gpuworkers.engine import LLMEngine

    torch.set_num_threads(2)
    return LLMEngine.from_pretrained(
        demo_dir,
        dtype="auto",
        # A pool counted in blocks, not bytes: the same 1,456 tokens whether
        # 'auto' resolves to bfloat16 or (on an AVX2-only CPU) float32, whose
        # twice-as-large tokens once halved a byte-sized pool under tests
        # that need a 1,037-token request to fit.
        num_kv_blocks=91,
        max_num_batched_tokens=128,
        model_id=MODEL,
    )


@pytest.fixture(scope="module")
def prompt_ids(engine) -> Callable[[str], list[int]]:
    def encode(text: str) -> list[int]:
        return apply_chat_template(engine.tokenizer, [{"role": "user", "content": text}])

    return encode


@pytest.fixture
def serve(engine):
    """``serve(worker_bus, **loop_options) -> WorkerLoop``, running and READY."""
    from gpuworkers.worker import WorkerLoop

    started: list[tuple[WorkerLoop, threading.Thread]] = []

    def start(worker_bus, **options) -> WorkerLoop:
        loop = WorkerLoop(engine, worker_bus, uid("worker"), MODEL, **options)
        thread = threading.Thread(target=loop.run, daemon=True)
        thread.start()
        assert loop.ready.wait(60) and not loop.stopped.is_set()
        started.append((loop, thread))
        return loop

    yield start
    for loop, thread in started:
        loop.request_stop()
        thread.join(30)
        assert not thread.is_alive()


@pytest.fixture
def demo_worker(engine, memory_bus):
    """The engine serving the demo model on the in-process bus (a WorkerLoop)."""
    from tests.serving import serving_worker

    with serving_worker(engine, DEMO, "demo") as loop:
        yield loop
