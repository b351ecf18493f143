"""The load benchmark's topology (``python -m bench.load``; also
``bench.serving``, ``bench.safety`` and ``bench.chaos``).

A private redis-server, one ``gpuworker`` and a Daphne on free loopback
ports, on a PostgreSQL database of the caller's (created and migrated if
missing), and a tenant on a ``bench-load`` tier (the enterprise tier with
caps high enough to admit a whole burst) with one key.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import asdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# One per bench run: the topology's processes must agree on it.
BENCH_SECRET_KEY = "bench-" + secrets.token_urlsafe(32)
MODEL = "smollm2-135m-instruct"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


# -- the topology --------------------------------------------------------------


class Topology:
    """redis-server, gpuworker and Daphne subprocesses; ``stop`` leaves none running."""

    def __init__(self, args: argparse.Namespace):
        self.args = args
        self.logs = Path(tempfile.mkdtemp(prefix="bench-load-"))
        self.procs: list[tuple[str, subprocess.Popen]] = []
        self.redis_url = f"redis://127.0.0.1:{free_port()}/0"
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}/v1"
        self.worker_id = f"bench-load-{os.getpid()}"
        # A folder: each process appends its spans to <name>.jsonl there
        # (TRACES_FILE, wire.tracing); None: no tracing.
        self.traces: Path | None = None

    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL")}
        env.update(
            DJANGO_SETTINGS_MODULE="config.settings",
            DATABASE_URL=self.args.database_url,
            REDIS_URL=self.redis_url,
            ENGINE_KV_CACHE_MB=str(self.args.kv_cache_mb),
            ENGINE_THREADS=str(self.args.threads),
            LOG_LEVEL="WARNING",
            DJANGO_DEBUG="0",
        )
        # Local mode, as bin/run sets it: loopback hosts, no Redis password.
        env.setdefault("DJANGO_ENV", "local")
        env.setdefault("DJANGO_SECRET_KEY", BENCH_SECRET_KEY)
        return env

    def _start(self, name: str, cmd: list[str]) -> subprocess.Popen:
        log = (self.logs / f"{name}.log").open("w")
        env = self.env()
        if self.traces is not None:
            env["TRACES_FILE"] = str(self.traces / f"{name}.jsonl")
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
        self.procs.append((name, proc))
        return proc

    def start(self) -> None:
        port = self.redis_url.rsplit(":", 1)[1].split("/")[0]
        self._start(
            "redis",
            [
                "redis-server",
                "--port",
                port,
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
            ],
        )
        manage = [sys.executable, "manage.py"]
        self._start(
            "gpuworker", [*manage, "gpuworker", "--model", MODEL, "--worker-id", self.worker_id]
        )
        daphne = [sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(self.port)]
        self._start("daphne", [*daphne, "config.asgi:application"])
        self._wait_ready(timeout=600)

    def _wait_ready(self, timeout: float) -> None:
        import redis

        client = redis.Redis.from_url(self.redis_url)
        deadline = time.monotonic() + timeout
        http_up = worker_up = False
        while not (http_up and worker_up):
            for name, proc in self.procs:
                if proc.poll() is not None:
                    raise RuntimeError(f"{name} exited:\n{self.output()}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"the topology did not start:\n{self.output()}")
            if not http_up:
                try:
                    urllib.request.urlopen(f"{self.base_url}/models", timeout=2)
                except urllib.error.HTTPError:
                    http_up = True
                except OSError:
                    pass
            if not worker_up:
                try:
                    info = client.hget("llm:workers", self.worker_id)
                    worker_up = info is not None and json.loads(info)["state"] == "ready"
                except redis.RedisError:
                    pass
            time.sleep(0.5)
        client.close()

    def output(self) -> str:
        return "\n".join(
            f"--- {p.name}\n{p.read_text()[-3000:]}" for p in sorted(self.logs.glob("*.log"))
        )

    def stop(self) -> None:
        """Stop everything; the logs stay in ``self.logs`` for a post-mortem."""
        for _, proc in reversed(self.procs):
            if proc.poll() is None:
                proc.terminate()
        for _, proc in reversed(self.procs):
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)


def prepare_database(topology: Topology) -> str:
    """Create and migrate the bench database; a bench-load tier, tenant and key."""
    import psycopg

    name = topology.args.database_url.rsplit("/", 1)[1]
    admin_url = topology.args.database_url.rsplit("/", 1)[0] + "/postgres"
    with psycopg.connect(admin_url, autocommit=True) as conn:
        if not conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone():
            conn.execute(f'CREATE DATABASE "{name}"')
    subprocess.run(
        [sys.executable, "manage.py", "migrate", "--noinput"],
        cwd=ROOT,
        env=topology.env(),
        check=True,
        capture_output=True,
    )
    code = (
        "from bench.load_topology import create_tenant_key; "
        f"print(create_tenant_key(max_concurrent={topology.args.max_concurrent}))"
    )
    done = subprocess.run(
        [sys.executable, "manage.py", "shell", "-c", code],
        cwd=ROOT,
        env=topology.env(),
        check=True,
        capture_output=True,
        text=True,
    )
    return done.stdout.strip().splitlines()[-1]


def publish_snapshot(topology: Topology) -> int:
    """Publish the control snapshot to the running topology's Redis, as
    Celery beat does in production (``bin/run --topology``): the web then
    finds models, tiers and routing settings there instead of in the
    database. Its readers see it within FLEET_SNAPSHOT_REFRESH seconds."""
    done = subprocess.run(
        [
            sys.executable,
            "manage.py",
            "shell",
            "-c",
            "from fleet.services import snapshot_publish; print(snapshot_publish())",
        ],
        cwd=ROOT,
        env=topology.env(),
        check=True,
        capture_output=True,
        text=True,
    )
    return int(done.stdout.strip().splitlines()[-1])


def create_tenant_key(*, max_concurrent: int) -> str:
    """Runs inside ``manage.py shell``: the tier, a fresh tenant and its key."""
    from django.forms.models import model_to_dict

    from fleet.services import served_model_register
    from safety.models import TierSafetyPolicy
    from safety.policy import DEFAULT_BOUNDS
    from safety.services import tenant_safety_policy_update
    from tenants.models import Tier
    from tenants.services import api_key_create, tenant_create, tier_seed_defaults

    tier_seed_defaults()
    base = model_to_dict(Tier.objects.get(name="enterprise"), exclude=["id", "name"])
    base.update(
        display_name="Load bench",
        rpm=100_000,
        tpm=100_000_000,
        max_concurrent_requests=max_concurrent,
        # Queue-wait admission would refuse most of a 200-stream burst on
        # 2 cores; the bench measures the queue instead.
        queue_sla_seconds=3600,
    )
    tier, _ = Tier.objects.update_or_create(name="bench-load", defaults=base)
    # The enterprise tier's safety bounds, within which the tenant flags
    # what the classifier scores instead of refusing it: random-token
    # prompts (vLLM's random dataset) now and then score "offensive" (0.89
    # seen), and a throughput bench must not lose requests to that. The
    # checks still run on every prompt, so their cost is measured.
    TierSafetyPolicy.objects.update_or_create(
        tier=tier, defaults=asdict(DEFAULT_BOUNDS["enterprise"])
    )
    served_model_register(name=MODEL, context_length=8192)
    tenant = tenant_create(
        name=f"bench-load-{os.getpid()}-{time.time_ns()}", tier_name="bench-load"
    )
    tenant_safety_policy_update(tenant=tenant, classifier_action="flag", deny_action="flag")
    return api_key_create(tenant=tenant, name="load")[1]
