"""``manage.py gpuworker`` as a real process on Redis: drain on SIGTERM, loss on SIGKILL."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from inference.relay.dispatch import dispatch_request, stream_events
from tests.wire.bus.buses import needs_redis, redis_test_url, uid
from tokenization.tokenizer import apply_chat_template, load_tokenizer
from wire.bus.redis_bus import RedisBus, RedisWorkerBus
from wire.requests import GenerationRequest
from wire.sampling import Sampling

pytestmark = [needs_redis, pytest.mark.slow, pytest.mark.asyncio]

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def no_embedded_engine(settings):
    settings.EMBEDDED_ENGINE = False


@pytest.fixture
def start_worker(settings):
    """``start_worker() -> (process, worker_id)`` once the worker is READY."""
    procs: list[subprocess.Popen] = []

    async def start(bus: RedisBus) -> tuple[subprocess.Popen, str]:
        worker_id = uid("proc")
        env = {**os.environ, "REDIS_URL": redis_test_url(), "WORKER_HEARTBEAT_TTL": "2"}
        cmd = [sys.executable, "manage.py", "gpuworker", "--model", settings.DEMO_MODEL_NAME]
        cmd += ["--worker-id", worker_id, "--kv-cache-mb", "32", "--threads", "1"]
        proc = subprocess.Popen(
            cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        procs.append(proc)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and proc.poll() is None:
            workers = {w.worker_id: w for w in await bus.list_workers()}
            if worker_id in workers and workers[worker_id].state == "ready":
                return proc, worker_id
            await asyncio.sleep(0.3)
        proc.kill()
        pytest.fail(f"gpuworker never became ready:\n{proc.stdout.read()}")

    yield start
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
        proc.wait(10)


def _request(model: str, **sampling) -> GenerationRequest:
    tokenizer = load_tokenizer(_demo_dir())
    prompt = apply_chat_template(tokenizer, [{"role": "user", "content": "Tell me a story."}])
    return GenerationRequest(
        response_id=uid("resp"), model=model, prompt_token_ids=prompt, sampling=Sampling(**sampling)
    )


def _demo_dir() -> str:
    from gpuworkers.engine.convert_gguf import ensure_demo_model

    return str(ensure_demo_model())


async def test_sigterm_drains_the_running_response_then_deregisters(settings, start_worker):
    """The running response completes in full; the process exits 0 and leaves the registry."""
    bus = RedisBus(redis_test_url())
    proc, worker_id = await start_worker(bus)
    request = _request(settings.DEMO_MODEL_NAME, max_tokens=24, ignore_eos=True)
    assert (await dispatch_request(request, bus=bus)).worker_id == worker_id
    stream = stream_events(request.response_id, worker_id=worker_id, bus=bus)
    events = [await anext(stream)]
    proc.send_signal(signal.SIGTERM)
    events += [e async for e in stream]
    assert events[-1].type == "completed"
    assert events[-1].usage.completion_tokens == 24
    output, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0, output
    assert "draining" in output and "stopped" in output
    assert worker_id not in {w.worker_id for w in await bus.list_workers()}
    await bus.close()


async def test_sigkill_mid_stream_ends_the_stream_failed_within_seconds(settings, start_worker):
    """A killed worker: failed/worker_lost within about 2 s (its liveness key's
    TTL plus a poll; 3 s is the bound asserted), and it leaves the routing table."""
    bus = RedisBus(redis_test_url())
    proc, worker_id = await start_worker(bus)
    request = _request(settings.DEMO_MODEL_NAME, max_tokens=500, ignore_eos=True)
    await dispatch_request(request, bus=bus)
    events = []
    killed_at = None
    async for event in stream_events(request.response_id, worker_id=worker_id, bus=bus):
        events.append(event)
        if killed_at is None and event.type == "delta":
            proc.kill()
            killed_at = time.monotonic()
    assert time.monotonic() - killed_at < 3
    assert events[-1].type == "failed"
    assert events[-1].error.code == "worker_lost"
    assert [e.seq for e in events] == list(range(1, len(events) + 1))
    assert worker_id not in {w.worker_id for w in await bus.list_workers()}
    await bus.close()


async def test_sigterm_finishes_in_flight_and_a_peer_serves_what_was_queued(
    settings, start_worker, engine
):
    """SIGTERM mid-stream: the running response completes; a request queued on the
    draining worker is served by a live peer of the model; the process exits 0."""
    from gpuworkers.worker import WorkerLoop

    bus = RedisBus(redis_test_url())
    proc, worker_id = await start_worker(bus)
    peer = WorkerLoop(
        engine, RedisWorkerBus(redis_test_url()), uid("peer"), settings.DEMO_MODEL_NAME
    )
    thread = threading.Thread(target=peer.run, daemon=True)
    thread.start()
    try:
        assert await asyncio.to_thread(peer.ready.wait, 60)
        running = _request(settings.DEMO_MODEL_NAME, max_tokens=24, ignore_eos=True)
        await bus.submit(worker_id, running)
        stream = stream_events(running.response_id, worker_id=worker_id, bus=bus)
        events = [await anext(stream)]
        proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 30
        while (w := {w.worker_id: w for w in await bus.list_workers()}.get(worker_id)) and (
            w.state != "draining"
        ):
            assert time.monotonic() < deadline, "the worker never reported draining"
            await asyncio.sleep(0.1)
        queued = _request(settings.DEMO_MODEL_NAME, max_tokens=4, temperature=0.0)
        await bus.submit(worker_id, queued)
        events += [e async for e in stream]
        handed = [e async for e in stream_events(queued.response_id, worker_id=worker_id, bus=bus)]
    finally:
        peer.request_stop()
        thread.join(30)
    assert events[-1].type == "completed"
    assert events[-1].usage.completion_tokens == 24
    assert handed[0].worker_id == peer.worker_id
    assert handed[-1].type == "completed" and handed[-1].usage.completion_tokens == 4
    output, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0, output
    assert "draining" in output and "stopped" in output
    await bus.close()
