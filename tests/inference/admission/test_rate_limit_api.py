"""Rate limits and quotas through the real ASGI app and the official SDK.

A scripted worker answers on the in-process bus; the limiter is the
embedded one and the Redis one in turn. Refusals are checked through the
``openai`` SDK's typed exceptions, as a client sees them.
"""

from decimal import Decimal

import openai
import pytest
from asgiref.sync import sync_to_async

import tenants.ratelimit as ratelimit
from inference.relay import tap as relay
from tenants.models import Tier
from tests.plugins.asgi_client import asgi_get, asgi_post, sdk_client
from tests.plugins.request_path import DEMO
from tests.tenants.ratelimit_backends import KINDS, make_limiter
from tests.usage_records import record_usage

pytestmark = [
    pytest.mark.asyncio,
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("close_db_threads"),
]

MESSAGES = [{"role": "user", "content": "Say hi"}]
HEADERS = (
    "x-ratelimit-limit-requests",
    "x-ratelimit-remaining-requests",
    "x-ratelimit-reset-requests",
    "x-ratelimit-limit-tokens",
    "x-ratelimit-remaining-tokens",
    "x-ratelimit-reset-tokens",
)


@pytest.fixture(params=KINDS)
def limiter(request, memory_bus, monkeypatch):
    """The embedded limiter (no REDIS_URL), or a Redis one with its own prefix."""
    ratelimit.reset_limiters()
    if request.param == "memory":
        yield ratelimit.get_limiter()
    else:
        shared = make_limiter("redis")
        monkeypatch.setattr(ratelimit, "get_limiter", lambda: shared)
        yield shared
    ratelimit.reset_limiters()


@pytest.fixture
def make_key(api_key_factory, demo_model):
    """``make_key(quota=10**9, concurrent=16, **key_kw) -> (ApiKey, raw)`` on a fresh tier."""

    def make(quota: int = 10**9, concurrent: int = 16, **key_kw):
        tier = Tier.objects.create(
            name=f"rl-{Tier.objects.count()}",
            display_name="Rate-limit test",
            rpm=100,
            tpm=100_000,
            monthly_token_quota=quota,
            max_context_tokens=8192,
            max_output_tokens=2048,
            max_concurrent_requests=concurrent,
            scheduling_weight=Decimal("0.35"),
            priority=1,
            queue_sla_seconds=10,
            api_access=True,
        )
        demo_model.tiers.add(tier)
        return api_key_factory(tier=tier.name, **key_kw)

    return sync_to_async(make)


async def create(client: openai.AsyncOpenAI, max_tokens: int = 5):
    return await client.chat.completions.with_raw_response.create(
        model=DEMO, messages=MESSAGES, max_tokens=max_tokens
    )


async def test_success_carries_rate_limit_headers_and_tokens_settle_exactly(
    fake_worker, limiter, make_key
):
    """Every success has the six headers; the next admission sees the exact usage."""
    fake_worker(tokens=3)
    _, key = await make_key(tpm_limit=10_000)
    client = sdk_client(key)
    first = await create(client, max_tokens=50)
    usage = first.parse().usage
    assert {h: first.headers[h] for h in HEADERS[:3]} == {
        "x-ratelimit-limit-requests": "100",
        "x-ratelimit-remaining-requests": "99",
        "x-ratelimit-reset-requests": first.headers["x-ratelimit-reset-requests"],
    }
    # The request is counted before screening and tokenizing (a first
    # request loads the tokenizer), so its window may have run a few seconds.
    reset = first.headers["x-ratelimit-reset-requests"]
    assert reset == "1m0s" or 45 <= int(reset.removesuffix("s")) <= 59, reset
    assert first.headers["x-ratelimit-limit-tokens"] == "10000"
    reserved = usage.prompt_tokens + 50
    assert first.headers["x-ratelimit-remaining-tokens"] == str(10_000 - reserved)
    # The first response settled to prompt + 3 completion tokens.
    second = await create(client, max_tokens=50)
    settled = usage.prompt_tokens + usage.completion_tokens
    assert usage.completion_tokens == 3
    assert second.headers["x-ratelimit-remaining-tokens"] == str(10_000 - settled - reserved)
    assert second.headers["x-ratelimit-remaining-requests"] == "98"


async def test_rpm_refusal_is_rate_limit_error_with_retry_after(fake_worker, limiter, make_key):
    """Over the key's rpm: 429 rate_limit_exceeded, Retry-After and the headers."""
    fake_worker(tokens=1)
    _, key = await make_key(rpm_limit=2)
    client = sdk_client(key)
    await create(client)
    await create(client)
    with pytest.raises(openai.RateLimitError) as caught:
        await create(client)
    error = caught.value
    assert error.status_code == 429 and error.code == "rate_limit_exceeded"
    assert error.body["type"] == "requests"
    headers = error.response.headers
    assert 55 <= int(headers["retry-after"]) <= 60
    assert 54_000 < int(headers["retry-after-ms"]) <= 60_000
    assert headers["x-ratelimit-limit-requests"] == "2"
    assert headers["x-ratelimit-remaining-requests"] == "0"
    assert all(name in headers for name in HEADERS)


async def test_tpm_refusal_names_tokens(fake_worker, limiter, make_key):
    """A reservation over the tokens left is a 429 of type ``tokens``."""
    fake_worker(tokens=1)
    _, key = await make_key(tpm_limit=500)
    with pytest.raises(openai.RateLimitError) as caught:
        await create(sdk_client(key), max_tokens=600)
    assert caught.value.code == "rate_limit_exceeded"
    assert caught.value.body["type"] == "tokens"
    assert caught.value.response.headers["x-ratelimit-limit-tokens"] == "500"
    assert int(caught.value.response.headers["retry-after"]) >= 1


async def test_over_monthly_quota_is_insufficient_quota(fake_worker, limiter, make_key):
    """Usage this month (from the usage records) + the request over quota: 429 insufficient_quota."""
    worker = fake_worker(tokens=1)
    api_key, key = await make_key(quota=1000)
    await sync_to_async(record_usage)(
        response_id="chatcmpl-earlier",
        tenant_id=api_key.tenant_id,
        api_key_id=api_key.pk,
        model=DEMO,
        source="api",
        status="completed",
        finish_reason="stop",
        prompt_tokens=900,
        cached_tokens=0,
        completion_tokens=90,
        queue_time_ms=0,
        ttft_ms=1,
        duration_ms=1,
    )
    with pytest.raises(openai.RateLimitError) as caught:
        await create(sdk_client(key), max_tokens=50)
    assert caught.value.code == "insufficient_quota"
    assert caught.value.body["type"] == "insufficient_quota"
    assert "x-ratelimit-remaining-tokens" in caught.value.response.headers
    assert worker.received == []


async def test_an_exhausted_budget_is_insufficient_quota(fake_worker, limiter, make_key):
    """billing's BudgetExhausted reaches the client as OpenAI's 429 insufficient_quota."""
    worker = fake_worker(tokens=1)
    api_key, key = await make_key()
    tenant = await sync_to_async(lambda: api_key.tenant)()
    tenant.monthly_budget = Decimal("0")
    await sync_to_async(tenant.save)()
    with pytest.raises(openai.RateLimitError) as caught:
        await create(sdk_client(key), max_tokens=5)
    assert caught.value.code == "insufficient_quota"
    assert caught.value.body["type"] == "insufficient_quota"
    assert "monthly budget of 0.00" in caught.value.body["message"]
    assert worker.received == []


# Tokens each ending leaves in the window, given the prompt's length: the
# scripted worker emits 2 tokens, fails after 1, or rejects before any.
SETTLED = {
    "complete": lambda prompt: prompt + 2,
    "fail": lambda prompt: prompt + 1,
    "reject": lambda prompt: 0,
}


@pytest.mark.parametrize("mode", ["complete", "fail", "reject"])
async def test_slot_released_and_tokens_settled_after_each_ending(
    fake_worker, limiter, make_key, mode
):
    """Completed, failed and rejected responses give their slot back and settle
    their tokens (a rejection before the first token is refunded in full)."""
    worker = fake_worker(tokens=2, mode=mode)
    api_key, key = await make_key(concurrent=1)
    client = sdk_client(key)
    for _ in range(2):
        try:
            headers = (await create(client)).headers
        except openai.APIStatusError as exc:
            assert mode != "complete" and exc.status_code in (400, 500)
            headers = exc.response.headers
        assert all(name in headers for name in HEADERS)
    await relay.drain_background()
    assert await sync_to_async(limiter.in_flight)(tenant_id=api_key.tenant_id) == 0
    worker.mode = "complete"
    response = await create(client, max_tokens=1)
    prompt = response.parse().usage.prompt_tokens
    expected = 100_000 - 2 * SETTLED[mode](prompt) - (prompt + 1)
    assert response.headers["x-ratelimit-remaining-tokens"] == str(expected)


async def test_disconnect_releases_the_slot_and_the_cap_holds(fake_worker, limiter, make_key):
    """Cap 1: a held stream blocks the next request; its client leaving frees it."""
    worker = fake_worker(mode="hold")
    api_key, key = await make_key(concurrent=1)
    body = {"model": DEMO, "messages": MESSAGES, "max_tokens": 5, "stream": True}
    held = asgi_post("/v1/chat/completions", key, body)
    await held.read_until(b"data: ")
    assert held.status == 200 and held.headers["x-ratelimit-remaining-requests"] == "99"
    with pytest.raises(openai.RateLimitError) as caught:
        await create(sdk_client(key))
    assert caught.value.code == "rate_limit_exceeded"
    assert caught.value.response.headers["retry-after"] == "1"
    await held.disconnect()
    await relay.drain_background()
    assert worker.aborted
    assert await sync_to_async(limiter.in_flight)(tenant_id=api_key.tenant_id) == 0
    worker.mode = "complete"
    assert (await create(sdk_client(key))).parse().choices


async def test_no_worker_refunds_the_reservation(fake_worker, limiter, make_key):
    """A request that never reaches a worker (503) frees its slot and its tokens."""
    api_key, key = await make_key(concurrent=1)
    with pytest.raises(openai.APIStatusError) as caught:
        await create(sdk_client(key), max_tokens=50)
    assert caught.value.status_code == 503
    assert caught.value.response.headers["x-ratelimit-remaining-requests"] == "99"
    assert await sync_to_async(limiter.in_flight)(tenant_id=api_key.tenant_id) == 0
    fake_worker(tokens=1)
    response = await create(sdk_client(key), max_tokens=1)
    prompt = response.parse().usage.prompt_tokens
    assert response.headers["x-ratelimit-remaining-tokens"] == str(100_000 - prompt - 1)


# -- Work before admission is limited (issue 28) --------------------------------


async def test_moderations_count_against_the_key_rate(limiter, make_key):
    """/v1/moderations runs the screening checks: over the key's rpm it is a 429."""
    _, key = await make_key(rpm_limit=2)
    client = sdk_client(key)
    for _ in range(2):
        await client.moderations.create(input="hello")
    with pytest.raises(openai.RateLimitError) as caught:
        await client.moderations.create(input="hello")
    assert caught.value.code == "rate_limit_exceeded"
    assert caught.value.response.headers["x-ratelimit-limit-requests"] == "2"


async def test_resume_counts_against_the_key_rate(limiter, make_key):
    """Each resume replays a stream: counted like a request, 429 over the rate."""
    _, key = await make_key(rpm_limit=1)
    first = asgi_get("/v1/chat/completions/chatcmpl-gone/events", key)
    await first.read_all()
    assert first.status == 404
    second = asgi_get("/v1/chat/completions/chatcmpl-gone/events", key)
    body = await second.read_all()
    assert second.status == 429, body
    assert b"rate_limit_exceeded" in body and "retry-after" in second.headers


async def test_a_request_refused_for_its_length_still_spent_a_request(
    fake_worker, limiter, make_key
):
    """Screening and tokenizing ran for it: the refusal for length (400) took a
    request from the window, so the next one is over an rpm of 1."""
    worker = fake_worker(tokens=1)
    _, key = await make_key(rpm_limit=1)
    client = sdk_client(key)
    too_long = [{"role": "user", "content": "word " * 9000}]
    with pytest.raises(openai.BadRequestError) as caught:
        await client.chat.completions.create(model=DEMO, messages=too_long, max_tokens=5)
    assert caught.value.code == "context_length_exceeded"
    with pytest.raises(openai.RateLimitError):
        await create(client)
    assert worker.received == []
