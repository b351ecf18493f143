"""A batch survives its processes dying: the Celery worker feeding it, the
web process and the GPU worker are each killed (SIGKILL) mid-batch and
started again. Every custom_id ends as exactly one output or error line,
and each line's response is billed at most once.

Real processes on the test database and Redis: Daphne (with the usage
settler in process), one gpuworker, one Celery worker on the batches
queue; the beat's sweep is run by hand between the kills.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
from django.conf import settings

from tests.plugins import topology as topo

pytestmark = [pytest.mark.slow, pytest.mark.django_db]

LINES = 16
# Short leases and rounds, so a dead feeder's lines are taken over within
# seconds; few lines in flight, so each kill lands mid-batch.
ENV = {
    "BATCH_LINE_LEASE_SECONDS": "6",
    "BATCH_FEED_ROUND_SECONDS": "3",
    "BATCH_MAX_IN_FLIGHT_PER_BATCH": "3",
    "USAGE_SETTLER_IN_PROCESS": "true",
    "USAGE_SETTLE_INTERVAL": "1",
}


class Cluster:
    """One process per role; ``kill`` and ``start`` replace one."""

    def __init__(self, logs):
        self.logs = logs
        self.env = topo.base_env(DATABASE_URL=topo.test_db_url(), REDIS_URL=topo.redis_url(), **ENV)
        self.roles: dict[str, topo.Processes] = {}
        self.base_url = ""
        self.starts = 0

    def start(self, role: str) -> None:
        self.starts += 1
        procs = topo.Processes(self.logs / f"{role}-{self.starts}")
        procs.logs.mkdir()
        python = sys.executable
        if role == "web":
            port = topo.free_port()
            cmd = [
                python,
                "-m",
                "daphne",
                "-b",
                "127.0.0.1",
                "-p",
                str(port),
                "config.asgi:application",
            ]
            procs.start(role, cmd, self.env)
            self.base_url = f"http://127.0.0.1:{port}/v1"
            topo.wait_for_http(self.base_url, procs)
        elif role == "gpuworker":
            self.worker_id = f"chaos-{os.urandom(3).hex()}"
            cmd = [python, "manage.py", "gpuworker", "--model", settings.DEMO_MODEL_NAME]
            procs.start(role, [*cmd, "--worker-id", self.worker_id], self.env)
            topo.wait_for_worker(self.worker_id, procs)
        else:
            cmd = [python, "-m", "celery", "-A", "config.celery_app", "worker", "-Q", "batches"]
            procs.start(role, [*cmd, "--pool", "threads", "-l", "warning"], self.env)
        self.roles[role] = procs

    def kill(self, role: str) -> None:
        for proc, _ in self.roles[role].procs:
            proc.send_signal(signal.SIGKILL)
            proc.wait(10)

    def sweep(self) -> None:
        """What the beat does every minute: expiry, and feeders found dead."""
        code = "from batches.tasks import batches_sweep; batches_sweep.apply()"
        subprocess.run(
            [sys.executable, "manage.py", "shell", "-c", code],
            cwd=topo.ROOT,
            env=self.env,
            check=True,
            capture_output=True,
            timeout=120,
        )

    def stop(self) -> None:
        for procs in self.roles.values():
            procs.stop()

    def output(self) -> str:
        return "\n".join(procs.output() for procs in self.roles.values())


@pytest.fixture(scope="module")
def cluster(django_db_setup, django_db_blocker, tmp_path_factory):
    if "postgresql" not in settings.DATABASES["default"]["ENGINE"]:
        pytest.skip("needs PostgreSQL")
    from fleet.services import served_model_register
    from tenants.services import api_key_create, tenant_create, tier_seed_defaults

    with django_db_blocker.unblock():
        tier_seed_defaults()
        served_model_register(name=settings.DEMO_MODEL_NAME, context_length=8192)
        tenant = tenant_create(name=f"chaos-{os.urandom(4).hex()}", tier_name="pro")
        key = api_key_create(tenant=tenant, name="chaos")[1]
    cluster = Cluster(tmp_path_factory.mktemp("chaos"))
    cluster.key, cluster.tenant_id = key, tenant.pk
    try:
        for role in ("gpuworker", "web", "celery"):
            cluster.start(role)
        yield cluster
    finally:
        cluster.stop()
        # Its usage records and batches would skew every later test that
        # counts rows (billing's among them).
        with django_db_blocker.unblock():
            topo.tenants_purge([tenant.pk])


def counts(batch_id: str) -> tuple[str, int, int]:
    """The batch's status, its lines done and its lines in flight."""
    from batches.models import Batch, BatchLine

    lines = BatchLine.objects.filter(batch_id=batch_id)
    done = lines.filter(status__in=("succeeded", "failed")).count()
    return Batch.objects.get(pk=batch_id).status, done, lines.filter(status="running").count()


def wait_for(cluster: Cluster, batch_id: str, predicate, timeout: float, sweep: bool = False):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        status, done, running = counts(batch_id)
        if predicate(status, done, running):
            return status, done
        if sweep:
            cluster.sweep()
        time.sleep(1)
    pytest.fail(f"batch stuck at {counts(batch_id)}:\n{cluster.output()[-6000:]}")


def test_a_batch_survives_its_celery_worker_web_and_gpu_worker_dying(cluster):
    import openai

    from batches.models import BatchLine
    from billing.models import UsageRecord

    client = openai.OpenAI(api_key=cluster.key, base_url=cluster.base_url, max_retries=2)
    lines = [
        {
            "custom_id": f"c{i}",
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": {
                "model": settings.DEMO_MODEL_NAME,
                "messages": [{"role": "user", "content": f"Count to {i + 3}."}],
                "max_tokens": 24,
                "ignore_eos": True,
                "temperature": 0,
            },
        }
        for i in range(LINES)
    ]
    content = "".join(json.dumps(line) + "\n" for line in lines).encode()
    upload = client.files.create(file=("chaos.jsonl", content), purpose="batch")
    batch = client.batches.create(
        input_file_id=upload.id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    # The feeder, mid-round, with lines in flight.
    wait_for(cluster, batch.id, lambda s, done, running: done >= 2 and running, 120)
    cluster.kill("celery")
    cluster.kill("web")
    cluster.start("web")
    cluster.start("celery")
    # The lease runs out; the sweep feeds the batch again.
    _, before = wait_for(
        cluster, batch.id, lambda s, done, running: done >= 5 and running, 120, sweep=True
    )
    # The GPU worker, with lines generating on it.
    cluster.kill("gpuworker")
    cluster.start("gpuworker")
    status, _ = wait_for(
        cluster, batch.id, lambda s, done, running: s in ("completed", "failed"), 240, sweep=True
    )
    assert status == "completed"

    client = openai.OpenAI(api_key=cluster.key, base_url=cluster.base_url, max_retries=2)
    batch = client.batches.retrieve(batch.id)
    assert batch.request_counts.total == LINES
    assert batch.request_counts.completed + batch.request_counts.failed == LINES
    records = []
    for file_id in (batch.output_file_id, batch.error_file_id):
        if file_id:
            text = client.files.content(file_id).text
            records += [json.loads(line) for line in text.splitlines()]
    # Exactly one line per custom_id, across both files.
    assert sorted(r["custom_id"] for r in records) == sorted(f"c{i}" for i in range(LINES))
    assert batch.request_counts.completed >= before
    # The lines in flight at the kills were taken over by the new feeder.
    assert BatchLine.objects.filter(batch_id=batch.id, attempts__gt=1).exists()
    # Billed once: at most one usage record per line's response, and one
    # for every line that answered.
    response_ids = dict(
        BatchLine.objects.filter(batch_id=batch.id).values_list("custom_id", "response_id")
    )
    billed = list(
        UsageRecord.objects.filter(response_id__in=response_ids.values()).values_list(
            "response_id", flat=True
        )
    )
    assert len(billed) == len(set(billed))
    answered = {r["custom_id"] for r in records if r["error"] is None}
    deadline = time.monotonic() + 30
    while not {response_ids[c] for c in answered} <= set(billed) and time.monotonic() < deadline:
        time.sleep(1)
        billed = list(
            UsageRecord.objects.filter(response_id__in=response_ids.values()).values_list(
                "response_id", flat=True
            )
        )
    assert {response_ids[c] for c in answered} <= set(billed)
    assert {r.source for r in UsageRecord.objects.filter(response_id__in=billed)} == {"batch"}
