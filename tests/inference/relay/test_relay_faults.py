"""The relay when a response's event stream cannot be read to its end.

A fake worker on the in-process bus holds a response open, then an
event the relay cannot read (a delta without choices) lands on its stream:
the client gets exactly one ending (an error frame, then ``[DONE]``), the
usage record says ``failed``, and the worker is told to abort, so it does
not keep generating for a response nobody reads or bills.
"""

import asyncio
import importlib
import json

import pytest
from asgiref.sync import sync_to_async

from billing.models import UsageRecord
from inference.relay import tap as relay
from tests.plugins.asgi_client import asgi_post, sse_events
from tests.plugins.request_path import DEMO
from wire.events import Delta

pytestmark = [
    pytest.mark.asyncio,
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("close_db_threads"),
]


async def test_unreadable_event_fails_the_stream_once_and_aborts_the_worker(
    fake_worker, pro_key, monkeypatch
):
    worker = fake_worker(mode="hold")
    stream = asgi_post(
        "/v1/chat/completions",
        pro_key,
        {"model": DEMO, "messages": [{"role": "user", "content": "hi"}], "stream": True},
    )
    seen = await stream.read_until(b"c0t0")
    response_id = json.loads(sse_events(seen)[0][1])["id"]
    # A message no release of ours writes (a delta without choices) lands on
    # the stream: the bus stores what its encoder gives it.
    memory_bus_module = importlib.import_module("wire.bus.memory_bus")
    monkeypatch.setattr(memory_bus_module, "encode_event", lambda _: '{"type":"delta","seq":3}')
    worker.bus.publish(response_id, Delta(3, ()))
    frames = sse_events(seen + await stream.read_all())
    assert frames[-1][1] == "[DONE]" and sum(data == "[DONE]" for _, data in frames) == 1
    errors = [json.loads(d)["error"] for _, d in frames[:-1] if "error" in json.loads(d)]
    assert [e["code"] for e in errors] == ["stream_interrupted"]
    for _ in range(100):
        if worker.aborted:
            break
        await asyncio.sleep(0.05)
    assert worker.aborted == [response_id]
    await relay.drain_background()
    record = await sync_to_async(UsageRecord.objects.get)(response_id=response_id)
    assert record.status == "failed"
