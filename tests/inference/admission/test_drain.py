"""Graceful shutdown of a web process (inference.admission.drain), in-process.

A scripted worker holds a response open (one delta, then it waits for an
abort). Draining refuses new responses with 503 ``server_draining`` and
Retry-After, and /readyz says not ready; at the deadline the open stream
ends with one ``server_shutdown`` error frame and ``[DONE]``, the worker is
told to abort and the usage record is written from its ``cancelled`` ending.
"""

import asyncio
import json

import pytest
from asgiref.sync import sync_to_async

from billing.models import UsageRecord
from inference.admission import drain
from inference.relay import tap as relay
from tests.plugins.asgi_client import ASGIStream, asgi_post, sse_events
from tests.plugins.request_path import DEMO

pytestmark = [
    pytest.mark.asyncio,
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("close_db_threads"),
]

BODY = {"model": DEMO, "messages": [{"role": "user", "content": "hi"}], "stream": True}


@pytest.fixture(autouse=True)
def serving_again():
    yield
    drain.reset()


async def test_drain_refuses_new_work_and_ends_open_streams_at_the_deadline(fake_worker, pro_key):
    worker = fake_worker(mode="hold")
    stream = asgi_post("/v1/chat/completions", pro_key, BODY)
    seen = await stream.read_until(b"c0t0")
    response_id = json.loads(sse_events(seen)[0][1])["id"]

    draining = asyncio.create_task(drain.drain(deadline_seconds=1.0))
    await asyncio.sleep(0.2)
    refused = asgi_post("/v1/chat/completions", pro_key, BODY)
    body = json.loads(await refused.read_all())
    assert refused.status == 503
    assert body["error"]["code"] == "server_draining"
    assert refused.headers["retry-after"] == "1"
    ready = ASGIStream("GET", "/readyz", {}, b"")
    checks = json.loads(await ready.read_all())["checks"]
    assert ready.status == 503 and checks["draining"] is True

    frames = sse_events(seen + await stream.read_all())
    report = await draining
    assert frames[-1][1] == "[DONE]" and sum(data == "[DONE]" for _, data in frames) == 1
    errors = [json.loads(d)["error"] for _, d in frames[:-1] if "error" in json.loads(d)]
    assert [e["code"] for e in errors] == ["server_shutdown"]
    assert (report.open_at_start, report.shut_down) == (1, 1)
    assert worker.aborted == [response_id]
    await relay.drain_background()
    record = await sync_to_async(UsageRecord.objects.get)(response_id=response_id)
    assert record.status == "cancelled" and record.completion_tokens == 1


async def test_drain_with_nothing_open_returns_at_once(fake_worker, pro_key):
    report = await drain.drain(deadline_seconds=30.0)
    assert (report.open_at_start, report.shut_down) == (0, 0)
    assert report.seconds < 10
    assert drain.draining()
