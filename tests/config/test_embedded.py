"""Embedded mode: no Redis, the engine runs in a thread of this process."""

from __future__ import annotations

import asyncio

import pytest

from config import embedded as embedded_setup
from gpuworkers import embedded
from inference.relay.dispatch import ModelWarmingUp, dispatch_request, stream_events
from tests.wire.bus.buses import uid
from wire.bus import get_bus, reset_buses
from wire.requests import GenerationRequest
from wire.sampling import Sampling
from wire.workers import WorkerState


@pytest.fixture
def embedded_settings(settings):
    settings.REDIS_URL = None
    settings.EMBEDDED_ENGINE = True
    settings.ENGINE_KV_CACHE_MB = 32
    reset_buses()
    yield settings
    embedded.stop()
    reset_buses()


@pytest.mark.slow
@pytest.mark.asyncio
async def test_first_dispatch_starts_the_embedded_engine_once(embedded_settings):
    """The first dispatch_request starts loading and warming the demo model in a
    thread and is told at once that it is warming up; once ready, it serves and
    is reused."""
    from gpuworkers.engine.convert_gguf import ensure_demo_model
    from tokenization.tokenizer import apply_chat_template, load_tokenizer

    tokenizer = load_tokenizer(str(ensure_demo_model()))
    prompt = apply_chat_template(tokenizer, [{"role": "user", "content": "Hi!"}])
    model = embedded_settings.DEMO_MODEL_NAME
    finished = []
    with pytest.raises(ModelWarmingUp):
        await dispatch_request(
            GenerationRequest(
                response_id=uid("resp"), model=model, prompt_token_ids=prompt, sampling={}
            )
        )
    assert await asyncio.to_thread(embedded.current().wait_ready, 600)
    for _ in range(2):
        request = GenerationRequest(
            response_id=uid("resp"),
            model=model,
            prompt_token_ids=prompt,
            sampling=Sampling(max_tokens=8, temperature=0.0),
        )
        worker = await dispatch_request(request)
        assert worker.state == WorkerState.READY and worker.worker_id.startswith("embedded-")
        events = [e async for e in stream_events(request.response_id, worker_id=worker.worker_id)]
        finished.append(events[-1])
    assert [e.type for e in finished] == ["completed", "completed"]
    started = embedded.current()
    assert started is embedded_setup.start() and started.thread.is_alive()
    assert started.worker_id == worker.worker_id
    # Both sides share the one in-process bus.
    assert get_bus() is started.loop.bus


def test_a_bad_engine_quantization_stops_the_engine_with_a_clear_error(settings):
    """ENGINE_QUANTIZATION reaches the engine's configuration, which refuses
    an unknown value (before any weights load) and names what it takes."""
    settings.ENGINE_QUANTIZATION = "int4"
    with pytest.raises(ValueError, match=r"unknown quantization 'int4': expected one of int8"):
        embedded_setup._load_engine()
