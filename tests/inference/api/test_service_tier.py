"""service_tier on chat, completions and responses, through the openai SDK.

The worker is scripted (FakeWorker); everything between the SDK and the bus
is the real request path. The class the worker receives is the one the
response echoes: the tier actually used, never merely the one asked for.
"""

import json
from dataclasses import replace

import openai
import pytest
from asgiref.sync import sync_to_async

from billing.models import UsageRecord
from inference.relay import tap as relay
from tenants.models import Tier
from tests.plugins.asgi_client import asgi_post, sdk_client, sse_events
from tests.plugins.fake_worker import FakeWorker
from tests.plugins.request_path import DEMO
from wire.requests import ServiceClass
from wire.workers import WorkerInfo

pytestmark = [
    pytest.mark.asyncio,
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("close_db_threads", "demo_model"),
]

HELLO = [{"role": "user", "content": "Say hello."}]


async def new_key(api_key_factory, tier: str = "pro") -> str:
    return (await sync_to_async(api_key_factory)(tier=tier))[1]


async def test_chat_echoes_the_tier_used_whole_and_in_every_chunk(fake_worker, api_key_factory):
    worker = fake_worker(texts=["Hello", " there"])
    client = sdk_client(await new_key(api_key_factory))
    whole = await client.chat.completions.create(model=DEMO, messages=HELLO, service_tier="flex")
    assert whole.service_tier == "flex"
    stream = await client.chat.completions.create(
        model=DEMO,
        messages=HELLO,
        service_tier="default",
        stream=True,
        stream_options={"include_usage": True},
    )
    tiers = [chunk.service_tier async for chunk in stream]
    assert len(tiers) >= 3 and set(tiers) == {"default"}
    assert [r.service_class for r in worker.received] == [ServiceClass.FLEX, ServiceClass.DEFAULT]
    await relay.drain_background()


async def test_no_service_tier_is_served_and_echoed_as_default(fake_worker, api_key_factory):
    worker = fake_worker(texts=["Hi"])
    client = sdk_client(await new_key(api_key_factory))
    whole = await client.chat.completions.create(model=DEMO, messages=HELLO)
    auto = await client.chat.completions.create(model=DEMO, messages=HELLO, service_tier="auto")
    assert (whole.service_tier, auto.service_tier) == ("default", "default")
    assert {r.service_class for r in worker.received} == {ServiceClass.DEFAULT}
    await relay.drain_background()


async def test_priority_on_a_tier_without_it_is_served_at_default_and_says_so(
    fake_worker, api_key_factory
):
    """As OpenAI: served at the tier allowed, echoing the tier actually used."""
    worker = fake_worker(texts=["Hi"])
    client = sdk_client(await new_key(api_key_factory, tier="pro"))
    response = await client.chat.completions.create(
        model=DEMO, messages=HELLO, service_tier="priority"
    )
    assert response.service_tier == "default"
    assert worker.received[-1].service_class == ServiceClass.DEFAULT
    await relay.drain_background()


async def test_priority_where_the_tier_allows_it_and_auto_following_the_tier(
    fake_worker, api_key_factory
):
    worker = fake_worker(texts=["Hi"])
    client = sdk_client(await new_key(api_key_factory, tier="enterprise"))
    response = await client.chat.completions.create(
        model=DEMO, messages=HELLO, service_tier="priority"
    )
    assert response.service_tier == "priority"
    assert worker.received[-1].service_class == ServiceClass.PRIORITY
    await relay.drain_background()
    # The usage record says what the response is billed at.
    billed = await sync_to_async(UsageRecord.objects.get)(response_id=response.id)
    assert billed.service_tier == "priority"
    # The tier's auto_service_tier decides what "auto" (or nothing) gets.
    await sync_to_async(Tier.objects.filter(name="enterprise").update)(
        auto_service_tier=Tier.AutoServiceTier.PRIORITY
    )
    client = sdk_client(await new_key(api_key_factory, tier="enterprise"))
    auto = await client.chat.completions.create(model=DEMO, messages=HELLO)
    assert auto.service_tier == "priority"
    assert worker.received[-1].service_class == ServiceClass.PRIORITY
    await relay.drain_background()


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions", "/v1/responses"])
async def test_an_unknown_service_tier_is_a_400_naming_it(fake_worker, api_key_factory, path):
    worker = fake_worker(texts=["Hi"])
    key = await new_key(api_key_factory)
    body = {"model": DEMO, "service_tier": "scale"}
    body |= {
        "/v1/chat/completions": {"messages": HELLO},
        "/v1/completions": {"prompt": "Hello"},
        "/v1/responses": {"input": "Hello"},
    }[path]
    stream = await asgi_post(path, key, body).started()
    assert stream.status == 400
    error = stream.json(await stream.read_all())["error"]
    assert (error["param"], error["type"]) == ("service_tier", "invalid_request_error")
    assert worker.received == []


async def test_completions_echo_the_service_tier_whole_and_streamed(fake_worker, api_key_factory):
    worker = fake_worker(texts=["Hello", " there"])
    client = sdk_client(await new_key(api_key_factory))
    whole = await client.completions.create(
        model=DEMO, prompt="Hi", max_tokens=4, extra_body={"service_tier": "flex"}
    )
    assert whole.model_extra["service_tier"] == "flex"
    stream = await client.completions.create(
        model=DEMO, prompt="Hi", max_tokens=4, stream=True, extra_body={"service_tier": "flex"}
    )
    tiers = [chunk.model_extra["service_tier"] async for chunk in stream]
    assert tiers and set(tiers) == {"flex"}
    assert {r.service_class for r in worker.received} == {ServiceClass.FLEX}
    await relay.drain_background()


async def test_responses_echo_the_service_tier_whole_and_in_streamed_bodies(
    fake_worker, api_key_factory
):
    worker = fake_worker(texts=["Hello"])
    key = await new_key(api_key_factory)
    client = sdk_client(key)
    whole = await client.responses.create(model=DEMO, input="Hi", service_tier="flex")
    assert whole.service_tier == "flex"
    stream = await asgi_post(
        "/v1/responses", key, {"model": DEMO, "input": "Hi", "stream": True, "service_tier": "flex"}
    ).started()
    bodies = [json.loads(data) for _, data in sse_events(await stream.read_all())]
    responses = [b["response"] for b in bodies if "response" in b]
    assert len(responses) >= 3 and {r["service_tier"] for r in responses} == {"flex"}
    assert {r.service_class for r in worker.received} == {ServiceClass.FLEX}
    await relay.drain_background()


class DeepQueueWorker(FakeWorker):
    """A fake worker whose heartbeat reports a saturated engine with
    ``DEPTH`` pro requests queued (as a real fair-policy worker's stats)."""

    def info(self) -> WorkerInfo:
        extra = {
            "max_num_seqs": 4,
            "scheduling_policy": "fair",
            "tier_weights": {"enterprise": 0.5, "pro": 0.35, "free": 0.15},
            "queued_by_tier": {"pro": {"requests": DEPTH, "tokens": 0}},
            "fair_queue": {"pro": {"active_tenants": 1, "tenants": {}}},
        }
        return replace(
            super().info(), running=4, waiting=DEPTH, tokens_per_second=1000.0, extra=extra
        )


DEPTH = 40


async def test_flex_gets_429_flex_capacity_unavailable_when_the_queue_is_deep(
    memory_bus, api_key_factory, settings
):
    """Through the SDK: flex refused with Retry-After and nothing enqueued;
    the same tenant's default request (nothing of its own queued) is served."""
    settings.FLEX_MAX_QUEUE_DEPTH = DEPTH
    worker = DeepQueueWorker(texts=["Hi"]).start()
    try:
        client = sdk_client(await new_key(api_key_factory))
        with pytest.raises(openai.RateLimitError) as refused:
            await client.chat.completions.create(model=DEMO, messages=HELLO, service_tier="flex")
        assert refused.value.code == "flex_capacity_unavailable"
        assert int(refused.value.response.headers["Retry-After"]) >= 1
        assert worker.received == []
        served = await client.chat.completions.create(model=DEMO, messages=HELLO)
        assert served.service_tier == "default"
        await relay.drain_background()
    finally:
        worker.stop()
