"""The Redis bus protected: separate ACL users for the web and the workers.

Against a private redis-server running docker/redis's ACL file: each side
does all it needs with its own user, the worker cannot read what the web
reads (response streams, its cache, rate limits, Celery, the channel layer)
and the web cannot read what workers read (request streams) nor forge a
heartbeat; without a password nobody registers a worker.
"""

from __future__ import annotations

import asyncio
import uuid

import pytest
import redis

from billing.ledger.redis_ledger import RedisLedger
from tenants.ratelimit.base import Limits, Ticket
from tenants.ratelimit.redis_limiter import RedisLimiter
from tests.deploy.redis_acl import acl_redis  # noqa: F401 (fixture)
from wire.bus import BusUnavailable
from wire.bus.redis_bus import (
    RedisBus,
    RedisWorkerBus,
    abort_key,
    heartbeat_key,
    request_key,
    stream_key,
)
from wire.bus.redis_bus.common import wake_key
from wire.events import ChoiceDelta, Created, Delta, EventType, Terminal
from wire.requests import GenerationRequest
from wire.sampling import Sampling
from wire.snapshot import RedisSnapshotStore
from wire.workers import WorkerInfo, WorkerState

SNAPSHOT_KEY = "fleet:snapshot"


def worker_info(worker_id: str) -> WorkerInfo:
    return WorkerInfo(worker_id=worker_id, model="m", state=WorkerState.READY)


def request(response_id: str) -> GenerationRequest:
    return GenerationRequest(
        response_id=response_id, model="m", prompt_token_ids=[1, 2], sampling=Sampling(), tier="pro"
    )


def test_web_and_worker_serve_a_request_each_as_their_own_user(acl_redis):  # noqa: F811
    worker_id, response_id = f"w-{uuid.uuid4().hex[:6]}", f"chatcmpl-{uuid.uuid4().hex}"
    acl_redis.reset_denials()
    worker = RedisWorkerBus(acl_redis.url("worker"))
    RedisSnapshotStore(acl_redis.url("web"), SNAPSHOT_KEY).store_raw(3, '{"version": 3}')
    assert RedisSnapshotStore(acl_redis.url("worker"), SNAPSHOT_KEY).fetch() == '{"version": 3}'

    async def web_side() -> list[dict]:
        web = RedisBus(acl_redis.url("web"))
        try:
            worker.register(worker_info(worker_id))
            assert [w.worker_id for w in await web.list_workers()] == [worker_id]
            assert await web.worker_alive(worker_id)
            await web.submit(worker_id, request(response_id))
            await web.request_abort(worker_id, "chatcmpl-other")
            received, aborts = await asyncio.to_thread(worker.poll, worker_id, 1000)
            assert [r.response_id for r in received] == [response_id]
            assert aborts == ["chatcmpl-other"]
            events = [
                Created(response_id=response_id, model="m", worker_id=worker_id, prompt_tokens=2),
                Delta(2, (ChoiceDelta(0, "hi", (5,)),)),
                Terminal(EventType.COMPLETED, 3),
            ]
            assert worker.publish_many([(response_id, e) for e in events]) == set()
            read = await web.read_events(response_id, 0, 1000)
            # Closed already: the web's own terminal is refused, as it should be.
            assert not await web.publish_if_open(response_id, Terminal(EventType.FAILED, 0))
            worker.deregister(worker_id)
            assert await web.list_workers() == []
            return read
        finally:
            await web.close()

    read = asyncio.run(web_side())
    assert [e.type for e in read] == ["created", "delta", "completed"]
    assert acl_redis.denials() == []


def test_the_webs_shared_stream_reader_runs_under_its_acl(acl_redis):  # noqa: F811
    """Blocking reads share one XREAD that a private wake stream interrupts
    when a stream joins (wire/bus/redis_bus/fanout.py): the wake's XADD and
    EXPIRE, the XREAD over it and close()'s DEL are all the web's to do."""
    acl_redis.reset_denials()
    worker = RedisWorkerBus(acl_redis.url("worker"))
    first, second = f"chatcmpl-{uuid.uuid4().hex}", f"chatcmpl-{uuid.uuid4().hex}"
    event = Created(response_id=second, model="m", worker_id="w", prompt_tokens=1)

    async def web_side() -> list[dict]:
        web = RedisBus(acl_redis.url("web"))
        try:
            waiting = asyncio.create_task(web.read_events(first, 0, 5000))
            for _ in range(1000):  # until the shared XREAD blocks over ``first``
                if web._fanout._reading or waiting.done():
                    break
                await asyncio.sleep(0.01)
            assert not waiting.done(), waiting
            worker.publish(second, event)
            read = await web.read_events(second, 0, 5000)  # joins: wakes the XREAD
            assert not waiting.done()
            return read
        finally:
            await web.close()

    assert asyncio.run(web_side()) == [event]
    assert acl_redis.denials() == []
    assert not acl_redis._admin().keys("llm:wake:*")


def test_each_user_is_refused_what_the_other_side_reads(acl_redis):  # noqa: F811
    """A worker with its credentials cannot read the web's streams (response
    streams) nor its other keys; the web's credentials cannot read the
    workers' streams (requests carry every tenant's prompts) nor forge a
    heartbeat."""
    web, worker = acl_redis.client("web"), acl_redis.client("worker")
    rid, wid = f"chatcmpl-{uuid.uuid4().hex}", f"w-{uuid.uuid4().hex[:6]}"
    web.xadd(stream_key(rid), {"e": "{}"}, id="0-1")
    web.xadd(request_key(wid), {"r": "{}"})
    web.set("cache:1:route", "x")

    refused_to_worker = [
        lambda: worker.xread({stream_key(rid): "0-0"}),
        lambda: worker.xrange(stream_key(rid)),
        lambda: worker.hgetall("llm:workers"),
        lambda: worker.get("cache:1:route"),
        lambda: worker.hgetall("rl:t:1"),
        lambda: worker.llen("celery:billing"),
        lambda: worker.zrange("asgi:group:chat", 0, -1),
        lambda: worker.xadd(request_key("another-worker"), {"r": "{}"}),  # forge work
        lambda: worker.xadd(wake_key("a-web-process"), {"w": "1"}),
        lambda: worker.hset(SNAPSHOT_KEY, "document", "{}"),
    ]
    refused_to_web = [
        lambda: web.xread({request_key(wid): "0-0"}),
        lambda: web.xrange(abort_key(wid)),
        lambda: web.set(heartbeat_key("fake"), "1"),
        lambda: web.keys("*"),
        lambda: web.flushdb(),
        lambda: web.config_get("*"),
    ]
    for attempt in [*refused_to_worker, *refused_to_web]:
        with pytest.raises(redis.exceptions.NoPermissionError):
            attempt()
    assert worker.xread({request_key(wid): "0-0"})  # what a worker is for


def test_a_fake_worker_cannot_register_without_worker_credentials(acl_redis):  # noqa: F811
    fake = worker_info(f"fake-{uuid.uuid4().hex[:6]}")
    for url in (acl_redis.url(), acl_redis.url("worker", password="guess")):
        with pytest.raises(BusUnavailable):
            RedisWorkerBus(url).register(fake)
    # The web's own credentials cannot write a heartbeat either.
    with pytest.raises(redis.exceptions.ResponseError):
        RedisWorkerBus(acl_redis.url("web")).register(fake)

    async def listed() -> list[str]:
        web = RedisBus(acl_redis.url("web"))
        try:
            return [w.worker_id for w in await web.list_workers()]
        finally:
            await web.close()

    assert fake.worker_id not in asyncio.run(listed())
    assert not acl_redis.client("web").hexists("llm:workers", fake.worker_id)


def test_the_web_users_rate_limits_and_budget_holds_run_under_its_acl(acl_redis):  # noqa: F811
    acl_redis.reset_denials()
    limiter = RedisLimiter(acl_redis.url("web"), prefix="rl")
    ticket = Ticket.for_response(response_id="r-acl", api_key_id=1, tenant_id=1)
    limits = Limits(
        key_rpm=5, key_tpm=1000, tenant_rpm=5, tenant_tpm=1000, max_concurrent=2,
        monthly_quota=10_000,
    )  # fmt: skip
    snapshot = limiter.admit(ticket=ticket, limits=limits, tokens=10, quota_seed=0)
    assert snapshot.outcome == "ok"
    assert limiter.renew(ticket=ticket)
    assert limiter.settle(ticket=ticket, tokens=4, quota_tokens=4)
    # The budget ledger shares the rl: prefix, so the same grant covers it.
    ledger = RedisLedger(acl_redis.url("web"), prefix="rl")
    held = ledger.reserve(account="1:salt:202601", hold_id="r-acl", amount=5, budget=50, seed=0)
    assert held.outcome == "ok"
    assert ledger.renew(account="1:salt:202601", hold_id="r-acl")
    assert ledger.settle(account="1:salt:202601", hold_id="r-acl", cost=3)
    assert ledger.catch_up(account="1:salt:202601", spent=9)
    assert acl_redis.denials() == []


def test_the_web_users_cache_channel_layer_and_celery_keys_fit_its_acl(
    acl_redis,  # noqa: F811
    settings,
):
    """Built from the platform's own settings (prefixes, transport options),
    with only the URL swapped: every key they use is one the web may touch."""
    from celery import Celery
    from channels_redis.core import RedisChannelLayer
    from django.core.cache.backends.redis import RedisCache
    from kombu import Connection

    if not settings.REDIS_URL:
        pytest.skip("the settings under test are the Redis ones (REDIS_URL)")
    url = acl_redis.url("web")
    acl_redis.reset_denials()

    cache = RedisCache(url, {**settings.CACHES["default"], "LOCATION": url})
    cache.set("route", {"worker": "w1"}, 30)
    assert cache.get("route") == {"worker": "w1"}

    async def channels_round_trip() -> dict:
        layer = RedisChannelLayer(
            **{**settings.CHANNEL_LAYERS["default"]["CONFIG"], "hosts": [url]}
        )
        channel = await layer.new_channel()
        await layer.group_add("chat", channel)
        await layer.group_send("chat", {"type": "chat.message", "text": "hi"})
        message = await layer.receive(channel)
        await layer.group_discard("chat", channel)
        await layer.close_pools()
        return message

    assert asyncio.run(channels_round_trip())["text"] == "hi"

    options = settings.CELERY_BROKER_TRANSPORT_OPTIONS
    with Connection(url, transport_options=options) as connection:
        queue = connection.SimpleQueue("billing")
        queue.put({"task": "t"})
        message = queue.get(timeout=5)
        assert message.payload == {"task": "t"}
        message.ack()
        queue.close()
    app = Celery(
        broker=url,
        backend=url,
        set_as_current=False,
        result_backend_transport_options=settings.CELERY_RESULT_BACKEND_TRANSPORT_OPTIONS,
    )
    app.backend.store_result("task-1", 42, "SUCCESS")
    assert app.backend.get_task_meta("task-1")["result"] == 42
    assert acl_redis.denials() == []
