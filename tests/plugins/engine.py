"""Worker-loop fixtures: the real demo-model engine, served from a thread.

The engine is loaded once per module (bfloat16, a small KV pool and step
budget so warm-up stays about a second); ``serve`` runs a ``WorkerLoop`` on
it over a chosen bus and stops it after the test.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import pytest
import torch

from gpuworkers.engine import LLMEngine
from gpuworkers.engine.convert_gguf import ensure_demo_model
from gpuworkers.worker import WorkerLoop
from tests.wire.bus.buses import uid
from tokenization.tokenizer import apply_chat_template

MODEL = "demo-test"


@pytest.fixture(scope="module")
def engine() -> LLMEngine:
    torch.set_num_threads(2)
    return LLMEngine.from_pretrained(
        ensure_demo_model(),
        dtype="bfloat16",
        kv_cache_bytes=32 << 20,
        max_num_batched_tokens=128,
        model_id=MODEL,
    )


@pytest.fixture(scope="module")
def prompt_ids(engine) -> Callable[[str], list[int]]:
    def encode(text: str) -> list[int]:
        return apply_chat_template(engine.tokenizer, [{"role": "user", "content": text}])

    return encode


@pytest.fixture
def serve(engine) -> Callable[..., WorkerLoop]:
    """``serve(worker_bus, **loop_options) -> WorkerLoop``, running and READY."""
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
