"""Redis restarted under a serving worker: clear errors, then recovery without restarts.

Runs a private redis-server on a free port, so restarting it disturbs no one.
"""

from __future__ import annotations

import asyncio
import shutil
import socket
import subprocess
import time

import pytest
import redis

from inference.relay.dispatch import dispatch_request, stream_events
from tests.plugins.engine import MODEL
from tests.wire.bus.buses import uid
from wire.bus import BusUnavailable
from wire.bus.redis_bus import RedisBus, RedisWorkerBus
from wire.requests import GenerationRequest
from wire.sampling import Sampling

pytestmark = [
    pytest.mark.slow,
    pytest.mark.asyncio,
    pytest.mark.skipif(not shutil.which("redis-server"), reason="no redis-server binary"),
]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _redis_server(port: int) -> subprocess.Popen:
    proc = subprocess.Popen(
        ["redis-server", "--port", str(port), "--save", "", "--appendonly", "no"],
        stdout=subprocess.DEVNULL,
    )
    client = redis.Redis(port=port)
    for _ in range(50):
        try:
            client.ping()
            return proc
        except redis.ConnectionError:
            time.sleep(0.1)
    proc.kill()
    pytest.fail("redis-server did not start")


@pytest.fixture
def private_redis():
    port = _free_port()
    procs = [_redis_server(port)]

    def restart_after(down_seconds: float) -> None:
        procs[0].kill()
        procs[0].wait()
        time.sleep(down_seconds)
        procs.append(_redis_server(port))

    yield f"redis://127.0.0.1:{port}/0", procs, restart_after
    for proc in procs:
        proc.kill()
        proc.wait()


@pytest.fixture(autouse=True)
def no_embedded_engine(settings):
    settings.EMBEDDED_ENGINE = False


async def test_streams_fail_clearly_while_redis_is_down_and_service_recovers(
    private_redis, serve, prompt_ids
):
    """In-flight stream: failed/bus_unavailable; dispatch: BusUnavailable; then all works again."""
    url, procs, restart_after = private_redis
    bus = RedisBus(url)
    loop = serve(RedisWorkerBus(url))
    prompt = prompt_ids("Tell me a story.")
    request = GenerationRequest(
        response_id=uid("resp"),
        model=MODEL,
        prompt_token_ids=prompt,
        sampling=Sampling(max_tokens=400, ignore_eos=True),
    )
    await dispatch_request(request, bus=bus)
    events = []
    restart = None
    async for event in stream_events(request.response_id, worker_id=loop.worker_id, bus=bus):
        events.append(event)
        if restart is None and event.type == "delta":
            procs[0].kill()
            procs[0].wait()
            restart = time.monotonic()
    assert events[-1].type == "failed"
    assert events[-1].error.code == "bus_unavailable"
    assert time.monotonic() - restart < 10
    with pytest.raises(BusUnavailable):
        await dispatch_request(request, bus=bus)
    await asyncio.to_thread(restart_after, 0)
    # The worker re-registers with its next heartbeat; nothing was restarted.
    deadline = time.monotonic() + 10
    while loop.worker_id not in {w.worker_id for w in await bus.list_workers()}:
        assert time.monotonic() < deadline, "worker did not come back"
        await asyncio.sleep(0.2)
    again = GenerationRequest(
        response_id=uid("resp"),
        model=MODEL,
        prompt_token_ids=prompt,
        sampling=Sampling(max_tokens=8, temperature=0.0),
    )
    assert (await dispatch_request(again, bus=bus)).worker_id == loop.worker_id
    finished = [
        e async for e in stream_events(again.response_id, worker_id=loop.worker_id, bus=bus)
    ]
    assert finished[-1].type == "completed"
    assert finished[-1].usage.completion_tokens == 8
    # The abandoned request no longer holds engine resources. The registry holds the
    # last heartbeat, which may predate `again` finishing, so wait for one after it:
    # an abandoned request still held would keep `running` above zero for good.
    deadline = time.monotonic() + 10
    while True:
        info = next(w for w in await bus.list_workers() if w.worker_id == loop.worker_id)
        if info.running == 0 and info.kv_blocks_used == 0:
            break
        assert time.monotonic() < deadline, f"engine still holds work: {info}"
        await asyncio.sleep(0.2)
    await bus.close()
