"""The real topology as subprocesses: Daphne, gpuworker, PostgreSQL, Redis.

``topology`` (module scope) commits a tenant and keys to the pytest-django
test database, then starts ``manage.py gpuworker`` and Daphne pointed at
that database and at $REDIS_URL, and waits until the worker is READY on the
bus and Daphne answers. ``embedded`` starts Daphne alone with neither
DATABASE_URL nor REDIS_URL: SQLite in a temporary file, the in-process bus
and engine thread.
"""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from django.conf import settings

ROOT = Path(__file__).resolve().parents[2]
START_TIMEOUT = 240
# Small pools keep the worker's start-up and warm-up short on a shared CPU.
ENGINE_ENV = {"ENGINE_KV_CACHE_MB": "64", "LOG_LEVEL": "WARNING", "DJANGO_DEBUG": "0"}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def redis_url() -> str:
    return os.environ.get("REDIS_URL") or "redis://127.0.0.1:6379/3"


@dataclass
class Processes:
    """Subprocesses whose output goes to files, shown when a start fails."""

    logs: Path
    procs: list[tuple[subprocess.Popen, Path]] = field(default_factory=list)

    def start(self, name: str, cmd: list[str], env: dict[str, str]) -> subprocess.Popen:
        log = self.logs / f"{name}.log"
        proc = subprocess.Popen(
            cmd, cwd=ROOT, env=env, stdout=log.open("w"), stderr=subprocess.STDOUT
        )
        self.procs.append((proc, log))
        return proc

    def run(self, cmd: list[str], env: dict[str, str]) -> str:
        done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stdout + done.stderr
        return done.stdout

    def output(self) -> str:
        return "\n".join(f"--- {log.name}\n{log.read_text()[-4000:]}" for _, log in self.procs)

    def stop(self) -> None:
        for proc, _ in self.procs:
            if proc.poll() is None:
                proc.terminate()
        for proc, _ in self.procs:
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)


def wait_for_http(base_url: str, procs: Processes, timeout: float = START_TIMEOUT) -> None:
    """Until GET /v1/models answers (401 without a key is an answer)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if any(p.poll() is not None for p, _ in procs.procs):
            pytest.fail(f"a process exited during start-up:\n{procs.output()}")
        try:
            urllib.request.urlopen(f"{base_url}/models", timeout=2)
        except urllib.error.HTTPError:
            return
        except OSError:
            time.sleep(0.3)
    pytest.fail(f"Daphne never answered:\n{procs.output()}")


def wait_for_ready(base: str, procs: Processes, timeout: float = START_TIMEOUT) -> None:
    """Until GET /readyz answers 200: every served model has a ready worker."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if any(p.poll() is not None for p, _ in procs.procs):
            pytest.fail(f"a process exited during start-up:\n{procs.output()}")
        try:
            with urllib.request.urlopen(f"{base}/readyz", timeout=5) as response:
                if response.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.5)
    pytest.fail(f"never ready:\n{procs.output()}")


def wait_for_worker(worker_id: str, procs: Processes, timeout: float = START_TIMEOUT) -> None:
    from wire.bus.redis_bus import RedisBus

    async def poll() -> bool:
        bus = RedisBus(redis_url())
        try:
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline:
                if any(p.poll() is not None for p, _ in procs.procs):
                    return False
                workers = {w.worker_id: w for w in await bus.list_workers()}
                if worker_id in workers and workers[worker_id].state == "ready":
                    return True
                await asyncio.sleep(0.5)
            return False
        finally:
            await bus.close()

    if not asyncio.run(poll()):
        pytest.fail(f"gpuworker never became ready:\n{procs.output()}")


def base_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL")}
    # The test settings, as in this process: users the tests create have
    # passwords hashed with the test run's fast hasher, which local mode's
    # hashers cannot verify (sign-in in the browser tests failed).
    env.update(ENGINE_ENV, DJANGO_SETTINGS_MODULE="config.settings.test", **extra)
    return env


def tenants_purge(tenant_ids: list[int]) -> None:
    """Delete tenants a module's processes served, with the billing history
    that PROTECTs them (usage records, then the invoices they point at):
    left behind, they skewed every later test that counts rows."""
    from billing.models import Invoice, UsageRecord
    from tenants.models import Tenant

    UsageRecord.objects.filter(tenant_id__in=tenant_ids).delete()
    Invoice.objects.filter(tenant_id__in=tenant_ids).delete()
    Tenant.objects.filter(pk__in=tenant_ids).delete()


def test_db_url() -> str:
    db = settings.DATABASES["default"]
    user = db.get("USER") or "postgres"
    password = f":{db['PASSWORD']}" if db.get("PASSWORD") else ""
    host, port = db.get("HOST") or "127.0.0.1", db.get("PORT") or 5432
    return f"postgres://{user}{password}@{host}:{port}/{db['NAME']}"


@dataclass
class Topology:
    base_url: str
    keys: dict[str, str]
    tenant_ids: list[int]
    worker_id: str


@pytest.fixture(scope="module")
def topology(django_db_setup, django_db_blocker, tmp_path_factory):
    if "postgresql" not in settings.DATABASES["default"]["ENGINE"]:
        pytest.skip("the multi-process topology needs DATABASE_URL (PostgreSQL)")
    from fleet.services import served_model_register
    from tenants.services import api_key_create, tenant_create, tier_seed_defaults

    suffix = os.urandom(4).hex()
    with django_db_blocker.unblock():
        tier_seed_defaults()
        served_model_register(name=settings.DEMO_MODEL_NAME, context_length=8192)
        tenants = {
            tier: tenant_create(name=f"e2e-{tier}-{suffix}", tier_name=tier)
            for tier in ("pro", "free")
        }
        keys = {tier: api_key_create(tenant=t, name="e2e")[1] for tier, t in tenants.items()}

    procs = Processes(tmp_path_factory.mktemp("e2e-logs"))
    env = base_env(DATABASE_URL=test_db_url(), REDIS_URL=redis_url())
    worker_id = f"e2e-worker-{suffix}"
    cmd = [sys.executable, "manage.py", "gpuworker", "--model", settings.DEMO_MODEL_NAME]
    procs.start("gpuworker", [*cmd, "--worker-id", worker_id], env)
    port = free_port()
    daphne = [sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port)]
    procs.start("daphne", [*daphne, "config.asgi:application"], env)
    base_url = f"http://127.0.0.1:{port}/v1"
    try:
        wait_for_http(base_url, procs)
        wait_for_worker(worker_id, procs)
        yield Topology(base_url, keys, [t.pk for t in tenants.values()], worker_id)
    finally:
        procs.stop()
        with django_db_blocker.unblock():
            tenants_purge([t.pk for t in tenants.values()])


@dataclass
class Embedded:
    base_url: str
    key: str
    sqlite_path: Path
    log: Processes


@pytest.fixture(scope="module")
def embedded(tmp_path_factory):
    """Daphne alone: SQLite file, in-process bus, in-process engine thread."""
    tmp = tmp_path_factory.mktemp("embedded")
    sqlite_path = tmp / "db.sqlite3"
    procs = Processes(tmp)
    env = base_env(SQLITE_PATH=str(sqlite_path))
    procs.run([sys.executable, "manage.py", "migrate", "--noinput"], env)
    out = procs.run(
        [sys.executable, "manage.py", "create_api_key", "--tenant", "e2e", "--tier", "pro"], env
    )
    key = out.strip().splitlines()[-1]
    port = free_port()
    daphne = [sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port)]
    procs.start("daphne", [*daphne, "config.asgi:application"], env)
    base_url = f"http://127.0.0.1:{port}/v1"
    try:
        wait_for_http(base_url, procs)
        # Until the engine thread has loaded and warmed up, requests get 503
        # model_warming_up: start the tests once /readyz says ready.
        wait_for_ready(base_url.removesuffix("/v1"), procs)
        yield Embedded(base_url, key, sqlite_path, procs)
    finally:
        procs.stop()
