"""Chat completions through the real ASGI app and the in-process bus.

A scripted worker answers on the bus, so these tests check the request
path and the relay (framing, usage, disconnects, resumes), not the model.
"""

import asyncio
import json

import pytest
from asgiref.sync import sync_to_async

from billing.models import UsageRecord
from inference.relay import tap as relay
from tests.helpers import async_wait_until
from tests.plugins.asgi_client import asgi_get, asgi_post, sse_events
from tests.plugins.request_path import DEMO

pytestmark = [
    pytest.mark.asyncio,
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("close_db_threads"),
]

MESSAGES = [{"role": "user", "content": "Say hi"}]


async def record_for(response_id: str) -> UsageRecord:
    await relay.drain_background()
    return await sync_to_async(UsageRecord.objects.get)(response_id=response_id)


def usage_of(record: UsageRecord) -> dict:
    return {
        "prompt_tokens": record.prompt_tokens,
        "completion_tokens": record.completion_tokens,
        "total_tokens": record.prompt_tokens + record.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": record.cached_tokens},
    }


async def test_non_streamed_completion_has_openai_shape_and_recorded_usage(fake_worker, pro_key):
    """One chat.completion whose usage equals the single UsageRecord row."""
    worker = fake_worker(tokens=3)
    stream = asgi_post(
        "/v1/chat/completions",
        pro_key,
        {"model": DEMO, "messages": MESSAGES, "max_tokens": 5, "seed": 7},
    )
    data = json.loads(await stream.read_all())
    assert stream.status == 200
    assert stream.headers["x-request-id"].startswith("req_")
    assert data["id"].startswith("chatcmpl-") and data["object"] == "chat.completion"
    assert data["model"] == DEMO
    assert data["choices"] == [
        {
            "index": 0,
            "message": {"role": "assistant", "content": "c0t0 c0t1 c0t2 ", "refusal": None},
            "logprobs": None,
            "finish_reason": "length",
        }
    ]
    record = await record_for(data["id"])
    assert data["usage"] == usage_of(record)
    assert (record.status, record.finish_reason, record.source) == ("completed", "length", "api")
    assert (record.queue_time_ms, record.ttft_ms, record.duration_ms) == (1, 6, 9)
    assert record.worker_id == worker.worker_id
    assert await sync_to_async(UsageRecord.objects.filter(response_id=data["id"]).count)() == 1


async def test_dispatched_request_carries_tier_priority_and_cache_salt(
    fake_worker, api_key_factory, demo_model
):
    """The worker gets the tenant's tier, priority, cache salt and sampling."""
    worker = fake_worker()
    api_key, key = await sync_to_async(api_key_factory)(tier="enterprise")
    stream = asgi_post(
        "/v1/chat/completions",
        key,
        {"model": DEMO, "messages": MESSAGES, "max_tokens": 4, "temperature": 0.5, "stop": "x"},
    )
    await stream.read_all()
    (request,) = worker.received
    tenant = await sync_to_async(lambda: api_key.tenant)()
    assert (request.tier, request.priority) == ("enterprise", 2)
    assert request.cache_salt == tenant.cache_salt and request.tenant_id == tenant.pk
    assert request.sampling.max_tokens == 4 and request.sampling.temperature == 0.5
    assert request.sampling.stop == ("x",)
    assert request.prompt_token_ids and all(isinstance(t, int) for t in request.prompt_token_ids)


async def test_stream_frames_role_first_finish_once_usage_chunk_and_done(fake_worker, pro_key):
    """n=2 stream: role chunk, deltas, one finish_reason per choice, usage, [DONE]."""
    fake_worker(tokens=3)
    payload = {
        "model": DEMO,
        "messages": MESSAGES,
        "n": 2,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    stream = asgi_post("/v1/chat/completions", pro_key, payload)
    await stream.started()
    assert stream.status == 200 and stream.headers["content-type"] == "text/event-stream"
    events = sse_events(await stream.read_all())
    assert events[-1][1] == "[DONE]"
    chunks = [json.loads(data) for _, data in events[:-1]]
    assert [c["delta"] for c in chunks[0]["choices"]] == [{"role": "assistant", "content": ""}] * 2
    texts, finishes = {0: "", 1: ""}, {0: [], 1: []}
    for position, chunk in enumerate(chunks[:-1]):
        assert chunk["object"] == "chat.completion.chunk" and chunk["usage"] is None
        for choice in chunk["choices"]:
            texts[choice["index"]] += choice["delta"].get("content") or ""
            if choice["finish_reason"]:
                finishes[choice["index"]].append(position)
    assert texts == {0: "c0t0 c0t1 c0t2 ", 1: "c1t0 c1t1 c1t2 "}
    # Exactly once per choice, and no later chunk mentions that choice.
    for index, positions in finishes.items():
        assert len(positions) == 1
        later = [
            c for c in chunks[positions[0] + 1 : -1] for ch in c["choices"] if ch["index"] == index
        ]
        assert later == []
    usage_chunk = chunks[-1]
    assert usage_chunk["choices"] == []
    record = await record_for(usage_chunk["id"])
    assert usage_chunk["usage"] == usage_of(record) and record.completion_tokens == 6
    # Default framing: every frame is one data: line alone (what vLLM's
    # benchmark reader and other minimal clients expect).
    assert all(event_id is None for event_id, _ in events)


async def test_resumable_header_adds_rising_event_ids(fake_worker, pro_key):
    """X-Stream-Resumable: 1 puts id: <seq> on the last frame of each event."""
    fake_worker(tokens=3)
    payload = {"model": DEMO, "messages": MESSAGES, "stream": True}
    stream = asgi_post("/v1/chat/completions", pro_key, payload, **{"x-stream-resumable": "1"})
    events = sse_events(await stream.read_all())
    ids = [int(event_id) for event_id, _ in events if event_id is not None]
    # created has no frame (the role chunk rides with the first delta), then
    # three deltas, the terminal (its finish chunk and [DONE] share one id).
    assert ids == [2, 3, 4, 5]
    assert json.loads(events[0][1])["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert events[0][0] is None and events[1][0] == "2"
    assert events[-1] == ("5", "[DONE]")


async def test_error_after_first_byte_is_an_error_frame_then_done(fake_worker, pro_key):
    """A worker failure mid-stream: data: {"error": ...}, then [DONE]; usage says failed."""
    fake_worker(mode="fail")
    stream = asgi_post(
        "/v1/chat/completions", pro_key, {"model": DEMO, "messages": MESSAGES, "stream": True}
    )
    events = sse_events(await stream.read_all())
    assert stream.status == 200
    assert events[-1][1] == "[DONE]"
    error = json.loads(events[-2][1])["error"]
    assert error["code"] == "internal_error" and error["message"] == "GPU fell over"
    first = json.loads(events[0][1])
    record = await record_for(first["id"])
    assert (record.status, record.finish_reason, record.completion_tokens) == ("failed", "error", 1)


async def test_worker_rejection_of_a_non_streamed_request_is_an_http_error(fake_worker, pro_key):
    """created then failed (invalid_request_error) -> 400 with the worker's code."""
    fake_worker(mode="reject")
    stream = asgi_post("/v1/chat/completions", pro_key, {"model": DEMO, "messages": MESSAGES})
    body = json.loads(await stream.read_all())
    assert stream.status == 400
    assert body["error"]["code"] == "prompt_too_long"
    assert body["error"]["type"] == "invalid_request_error"


async def test_client_disconnect_cancels_the_request_and_records_usage(fake_worker, pro_key):
    """Disconnecting mid-stream aborts on the worker; usage is recorded as cancelled."""
    worker = fake_worker(mode="hold")
    stream = asgi_post(
        "/v1/chat/completions", pro_key, {"model": DEMO, "messages": MESSAGES, "stream": True}
    )
    seen = await stream.read_until(b"c0t0")
    response_id = json.loads(sse_events(seen)[0][1])["id"]
    await stream.disconnect()
    await async_wait_until(lambda: worker.aborted, timeout=30, message="abort on the worker")
    assert worker.aborted == [response_id]
    record = await record_for(response_id)
    assert (record.status, record.finish_reason) == ("cancelled", "abort")
    assert record.completion_tokens == 1


async def test_resume_with_last_event_id_replays_exactly_the_rest(
    fake_worker, pro_key, api_key_factory
):
    """GET .../events with Last-Event-ID k returns the original frames after k."""
    fake_worker(tokens=4)
    payload = {
        "model": DEMO,
        "messages": MESSAGES,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    stream = asgi_post("/v1/chat/completions", pro_key, payload, **{"x-stream-resumable": "1"})
    original = await stream.read_all()
    response_id = json.loads(sse_events(original)[0][1])["id"]
    await relay.drain_background()
    resumed = asgi_get(
        f"/v1/chat/completions/{response_id}/events", pro_key, **{"last-event-id": "3"}
    )
    body = await resumed.read_all()
    assert resumed.status == 200
    expected = original[original.index(b"id: 3\n") :].split(b"\n\n", 1)[1]
    assert body == expected and body.endswith(b"data: [DONE]\n\n")
    # Another tenant cannot read it; a malformed id is a 400 naming the header.
    other = asgi_get(
        f"/v1/chat/completions/{response_id}/events",
        (await sync_to_async(api_key_factory)(tier="pro"))[1],
    )
    assert json.loads(await other.read_all())["error"]["code"] == "not_found"
    assert other.status == 404
    bad = asgi_get(f"/v1/chat/completions/{response_id}/events", pro_key, **{"last-event-id": "x"})
    assert json.loads(await bad.read_all())["error"]["param"] == "Last-Event-ID"


async def test_no_ready_worker_is_503_service_unavailable(memory_bus, pro_key):
    """Nothing serves the model: 503 in OpenAI's shape, before any streaming."""
    stream = asgi_post(
        "/v1/chat/completions", pro_key, {"model": DEMO, "messages": MESSAGES, "stream": True}
    )
    body = json.loads(await stream.read_all())
    assert stream.status == 503
    assert body["error"]["code"] == "no_worker_available"


async def test_client_leaving_a_non_streamed_request_cancels_it(fake_worker, pro_key, monkeypatch):
    """The view is cancelled on disconnect; the worker is asked to abort and usage is kept."""
    # The client leaves while the view waits for the response's events: known
    # by the view's first call to the tap, not by sleeping and hoping.
    waiting = asyncio.Event()
    next_event = relay.ResponseTap.next_event

    async def watched_next_event(tap, timeout=None):
        waiting.set()
        return await next_event(tap, timeout)

    monkeypatch.setattr(relay.ResponseTap, "next_event", watched_next_event)
    worker = fake_worker(mode="hold")
    stream = asgi_post("/v1/chat/completions", pro_key, {"model": DEMO, "messages": MESSAGES})
    await asyncio.wait_for(waiting.wait(), timeout=30)
    await stream.disconnect()
    await async_wait_until(lambda: worker.aborted, timeout=30, message="abort on the worker")
    assert [r.response_id for r in worker.received] == worker.aborted
    record = await record_for(worker.aborted[0])
    assert record.status == "cancelled"


async def test_resume_by_post_with_after_query_parameter(fake_worker, pro_key):
    """POST .../events?after=0 replays the whole stream, for POST-only SSE clients."""
    fake_worker(tokens=2)
    payload = {"model": DEMO, "messages": MESSAGES, "stream": True}
    original = await asgi_post(
        "/v1/chat/completions", pro_key, payload, **{"x-stream-resumable": "1"}
    ).read_all()
    response_id = json.loads(sse_events(original)[0][1])["id"]
    await relay.drain_background()
    resumed = asgi_post(f"/v1/chat/completions/{response_id}/events?after=0", pro_key, {})
    assert await resumed.read_all() == original
