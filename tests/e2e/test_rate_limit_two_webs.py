"""A per-key RPM limit holds exactly across two web processes sharing Redis.

Two Daphne processes (same PostgreSQL database, same Redis) and one
``gpuworker`` serve one enterprise key limited to ``LIMIT`` requests per
minute. 200 chat completions fired at once, alternating between the two
webs, must admit exactly ``LIMIT``: the Lua admission script is the only
thing that decides, atomically, whichever process asks.

Why enterprise: a refused request takes no concurrency slot, so at most
``LIMIT`` requests hold one at any time; the enterprise cap (64 concurrent)
is above ``LIMIT``, and so are the worker's 64 running slots, so neither
the concurrency cap nor queue-wait admission control can refuse any of
them: every 429 must come from the requests-per-minute limit. The tier's
own RPM (3000) and TPM are far above what 200 one-token requests use.

Each web gets 100 requests, more than ``LIMIT``: a limit kept per process
would admit up to twice ``LIMIT``. All 200 are released together and
all are in flight at once: each web process shares a bounded PostgreSQL
connection pool (settings DB_POOL_MAX), so the burst waits for connections
instead of running PostgreSQL out of them (which gave 500s before the pool).
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from dataclasses import dataclass

import httpx
import pytest
import redis
from django.conf import settings

from billing.models import UsageRecord
from tests.e2e.flows import MESSAGES, MODEL

# As a module: importing its ``test_db_url`` by name would collect it as a test.
from tests.plugins import topology as e2e

pytestmark = pytest.mark.slow

LIMIT = 23
BURST = 200
IN_FLIGHT = 200


@dataclass
class TwoWebs:
    base_urls: list[str]
    key: str
    api_key_id: int
    tenant_id: int
    # The webs' own RATE_LIMIT_PREFIX: no state left in Redis by an earlier
    # run (ids restart with a new test database) can count here.
    prefix: str


@pytest.fixture(scope="module")
def two_webs(django_db_setup, django_db_blocker, tmp_path_factory):
    if "postgresql" not in settings.DATABASES["default"]["ENGINE"]:
        pytest.skip("two web processes need DATABASE_URL (PostgreSQL)")
    from fleet.services import served_model_register
    from tenants.models import Tenant
    from tenants.services import api_key_create, tenant_create, tier_seed_defaults

    suffix = os.urandom(4).hex()
    with django_db_blocker.unblock():
        tier_seed_defaults()
        served_model_register(name=settings.DEMO_MODEL_NAME, context_length=8192)
        tenant = tenant_create(name=f"e2e-rl-{suffix}", tier_name="enterprise")
        api_key, raw = api_key_create(tenant=tenant, name="burst", rpm_limit=LIMIT)
        # Warms both webs (tokenizer, connections) without using the burst
        # key's requests: its window must start with the burst.
        warm_key = api_key_create(tenant=tenant, name="warm-up")[1]

    procs = e2e.Processes(tmp_path_factory.mktemp("e2e-rl-logs"))
    prefix = f"rl-e2e-{suffix}"
    env = e2e.base_env(
        DATABASE_URL=e2e.test_db_url(), REDIS_URL=e2e.redis_url(), RATE_LIMIT_PREFIX=prefix
    )
    worker_id = f"e2e-rl-worker-{suffix}"
    cmd = [sys.executable, "manage.py", "gpuworker", "--model", settings.DEMO_MODEL_NAME]
    procs.start("gpuworker", [*cmd, "--worker-id", worker_id], env)
    base_urls = []
    for name in ("web-a", "web-b"):
        port = e2e.free_port()
        daphne = [sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port)]
        procs.start(name, [*daphne, "config.asgi:application"], env)
        base_urls.append(f"http://127.0.0.1:{port}/v1")
    try:
        for base_url in base_urls:
            e2e.wait_for_http(base_url, procs)
        e2e.wait_for_worker(worker_id, procs)
        for base_url in base_urls:
            warm_up(base_url, warm_key, procs)
        yield TwoWebs(base_urls, raw, api_key.pk, tenant.pk, prefix)
    finally:
        procs.stop()
        client = redis.Redis.from_url(e2e.redis_url())
        for name in client.scan_iter(match=f"{prefix}:*"):
            client.delete(name)
        client.close()
        with django_db_blocker.unblock():
            UsageRecord.objects.filter(tenant_id=tenant.pk).delete()
            Tenant.objects.filter(pk=tenant.pk).delete()


def warm_up(base_url: str, key: str, procs) -> None:
    body = {"model": MODEL, "messages": MESSAGES, "max_tokens": 1}
    headers = {"Authorization": f"Bearer {key}"}
    reply = httpx.post(f"{base_url}/chat/completions", json=body, headers=headers, timeout=120)
    assert reply.status_code == 200, f"{reply.text}\n{procs.output()}"


async def fire(webs: TwoWebs) -> list[httpx.Response]:
    """BURST requests released together, even ones to web A, odd ones to web B."""
    body = {"model": MODEL, "messages": MESSAGES, "max_tokens": 1}
    headers = {"Authorization": f"Bearer {webs.key}"}
    limits = httpx.Limits(max_connections=IN_FLIGHT, max_keepalive_connections=IN_FLIGHT)
    timeout = httpx.Timeout(120, connect=30, pool=60)
    start = asyncio.Event()
    async with httpx.AsyncClient(limits=limits, timeout=timeout, headers=headers) as client:

        async def one(i: int) -> httpx.Response:
            await start.wait()
            url = f"{webs.base_urls[i % 2]}/chat/completions"
            return await client.post(url, json=body)

        tasks = [asyncio.create_task(one(i)) for i in range(BURST)]
        await asyncio.sleep(0)
        start.set()
        return await asyncio.gather(*tasks)


def wait_until(check, timeout: float = 30.0):
    """``check()``'s value once truthy; its last value after ``timeout``."""
    deadline = time.monotonic() + timeout
    while not (value := check()) and time.monotonic() < deadline:
        time.sleep(0.2)
    return value


@pytest.mark.django_db
def test_burst_at_two_webs_admits_exactly_the_key_rpm(two_webs):
    """Exactly LIMIT of 200 simultaneous requests get a 200, each leaving one
    usage record; the rest get 429 rate_limit_exceeded (the RPM limit, with
    Retry-After and x-ratelimit-* headers); no concurrency slot stays held."""
    from tenants.ratelimit.redis_limiter import RedisLimiter

    started = time.monotonic()
    responses = asyncio.run(fire(two_webs))
    # One fixed one-minute window must hold the whole burst for "exactly".
    assert time.monotonic() - started < 50

    statuses = [r.status_code for r in responses]
    admitted = [r for r in responses if r.status_code == 200]
    refused = [r for r in responses if r.status_code == 429]
    assert len(admitted) == LIMIT, statuses
    assert len(refused) == BURST - LIMIT, statuses

    for r in refused:
        error = r.json()["error"]
        assert error["code"] == "rate_limit_exceeded", error
        assert error["type"] == "requests", error
        assert int(r.headers["Retry-After"]) >= 1
        assert int(r.headers["retry-after-ms"]) > 0
        assert r.headers["x-ratelimit-limit-requests"] == str(LIMIT)
        assert r.headers["x-ratelimit-remaining-requests"] == "0"
    # Each admission took the next request of the window: remaining counts
    # down LIMIT-1 .. 0 with no value given twice.
    remaining = sorted(int(r.headers["x-ratelimit-remaining-requests"]) for r in admitted)
    assert remaining == list(range(LIMIT))

    ids = {r.json()["id"] for r in admitted}
    assert len(ids) == LIMIT
    # Usage is written when each response ends, just after its body is sent.
    records = UsageRecord.objects.filter(api_key_id=two_webs.api_key_id)
    wait_until(lambda: records.count() >= LIMIT)
    assert sorted(records.values_list("response_id", flat=True)) == sorted(ids)

    limiter = RedisLimiter(e2e.redis_url(), prefix=two_webs.prefix)
    try:
        held = wait_until(lambda: limiter.in_flight(tenant_id=two_webs.tenant_id) == 0)
        assert held, limiter.in_flight(tenant_id=two_webs.tenant_id)
    finally:
        limiter.client.close()
