"""The topology of the stream-reliability tests (issue 7).

``live`` (package scope): Daphne + two gpuworker processes on the test
PostgreSQL database and a private redis-server on a free port, so the tests
can SIGKILL a worker and restart Redis without touching the shared one. One
topology for the whole package: a worker's start-up is most of the cost.
The modules run in name order and the destructive ones come last (Redis
restart, then the worker kill). An enterprise key and a rate-limit prefix
of its own let the tests count the tenant's concurrency slots.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from importlib import import_module

import pytest
import redis
from django.apps import apps
from django.conf import settings

from tenants.ratelimit.redis_limiter import RedisLimiter

# As a module: importing its ``test_db_url`` by name would collect it as a test.
from tests.plugins import topology as e2e
from tests.private_redis import PrivateRedis
from wire.bus.redis_bus import RedisBus
from wire.workers import WorkerInfo

# Each worker loads and warms up alone; on a 2-core machine shared with
# other work that can take minutes.
START_TIMEOUT = 600


@dataclass
class Live:
    base_url: str
    redis_url: str
    key: str
    tenant_id: int
    rate_limit_prefix: str
    workers: dict[str, subprocess.Popen]
    procs: e2e.Processes
    web: subprocess.Popen
    redis_server: PrivateRedis | None = None
    # "sessionid=..." of a member of the tenant, for the console chat socket;
    # None where the console app is not installed.
    session_cookie: str | None = None

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.key}"}

    def worker_stats(self) -> dict[str, WorkerInfo]:
        """The routing table as the web tier sees it: live heartbeats only."""

        async def read() -> list[WorkerInfo]:
            bus = RedisBus(self.redis_url)
            try:
                return await bus.list_workers()
            finally:
                await bus.close()

        return {w.worker_id: w for w in asyncio.run(read())}

    def slots_in_use(self) -> int:
        limiter = RedisLimiter(self.redis_url, prefix=self.rate_limit_prefix)
        try:
            return limiter.in_flight(tenant_id=self.tenant_id)
        finally:
            limiter.client.close()

    def wait_for(self, condition, timeout: float, what: str):
        """Poll ``condition()`` until truthy; fail with ``what`` and the logs."""
        deadline = time.monotonic() + timeout
        while True:
            value = condition()
            if value:
                return value
            if time.monotonic() > deadline:
                pytest.fail(f"{what} within {timeout}s\n{self.procs.output()}")
            time.sleep(0.1)


def member_session(tenant, suffix: str) -> str | None:
    """A signed-in session of a new member of ``tenant``, as a Cookie header value."""
    if not apps.is_installed("console"):
        return None
    from django.contrib.auth import (
        BACKEND_SESSION_KEY,
        HASH_SESSION_KEY,
        SESSION_KEY,
        get_user_model,
    )

    from tenants.services import membership_create

    user = get_user_model().objects.create_user(username=f"e2e-{suffix}", password="pw")
    membership_create(user=user, tenant=tenant, role="member")
    session = import_module(settings.SESSION_ENGINE).SessionStore()
    session[SESSION_KEY] = str(user.pk)
    session[BACKEND_SESSION_KEY] = "django.contrib.auth.backends.ModelBackend"
    session[HASH_SESSION_KEY] = user.get_session_auth_hash()
    session.create()
    return f"{settings.SESSION_COOKIE_NAME}={session.session_key}"


@contextlib.contextmanager
def topology(
    name: str, redis_url: str, n_workers: int, django_db_blocker, tmp_path_factory
) -> Iterator[Live]:
    if "postgresql" not in settings.DATABASES["default"]["ENGINE"]:
        pytest.skip("the multi-process topology needs DATABASE_URL (PostgreSQL)")
    from django.contrib.auth import get_user_model

    from billing.models import UsageRecord
    from fleet.services import served_model_register
    from tenants.models import Tenant
    from tenants.services import api_key_create, tenant_create, tier_seed_defaults

    suffix = os.urandom(4).hex()
    with django_db_blocker.unblock():
        tier_seed_defaults()
        served_model_register(name=settings.DEMO_MODEL_NAME, context_length=8192)
        tenant = tenant_create(name=f"e2e-{name}-{suffix}", tier_name="enterprise")
        key = api_key_create(tenant=tenant, name=name)[1]
        session_cookie = member_session(tenant, suffix)

    procs = e2e.Processes(tmp_path_factory.mktemp(f"e2e-{name}-logs"))
    prefix = f"rl-{name}-{suffix}"
    env = e2e.base_env(
        DATABASE_URL=e2e.test_db_url(),
        REDIS_URL=redis_url,
        RATE_LIMIT_PREFIX=prefix,
        # The console sends no max_tokens: its replies reserve the tier's
        # whole output cap (4096 on enterprise), more than 64 MiB holds.
        ENGINE_KV_CACHE_MB="256",
    )
    port = e2e.free_port()
    daphne = [sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port)]
    web = procs.start("daphne", [*daphne, "config.asgi:application"], env)
    live = Live(
        base_url=f"http://127.0.0.1:{port}/v1",
        redis_url=redis_url,
        key=key,
        tenant_id=tenant.pk,
        rate_limit_prefix=prefix,
        workers={},
        procs=procs,
        web=web,
        session_cookie=session_cookie,
    )
    cmd = [sys.executable, "manage.py", "gpuworker", "--model", settings.DEMO_MODEL_NAME]
    try:
        # One after the other: two warm-ups at once on a small CPU thrash
        # each other's threads and take several times as long.
        for i in range(n_workers):
            worker_id = f"e2e-{name}-{suffix}-w{i}"
            live.workers[worker_id] = procs.start(worker_id, [*cmd, "--worker-id", worker_id], env)
            live.wait_for(
                lambda w=worker_id: (s := live.worker_stats().get(w)) and s.state == "ready",
                START_TIMEOUT,
                f"gpuworker {worker_id} became ready",
            )
        e2e.wait_for_http(live.base_url, procs)
        yield live
    finally:
        procs.stop()
        with contextlib.suppress(redis.RedisError):
            client = redis.Redis.from_url(redis_url, socket_connect_timeout=1)
            for stale in client.scan_iter(match=f"{prefix}:*"):
                client.delete(stale)
            client.close()
        with django_db_blocker.unblock():
            UsageRecord.objects.filter(tenant_id=tenant.pk).delete()
            get_user_model().objects.filter(username=f"e2e-{suffix}").delete()
            Tenant.objects.filter(pk=tenant.pk).delete()


@pytest.fixture(scope="package")
def live(django_db_setup, django_db_blocker, tmp_path_factory):
    if not shutil.which("redis-server"):
        pytest.skip("no redis-server binary for a private Redis")
    server = PrivateRedis()
    server.start()
    try:
        with topology("live", server.url, 2, django_db_blocker, tmp_path_factory) as t:
            t.redis_server = server
            yield t
    finally:
        server.kill()
