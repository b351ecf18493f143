"""`bin/run --topology`: the Procfile's processes under honcho, end to end.

Daphne, a gpuworker, a Celery worker and Celery beat, started by the
README's command, on the pytest-django PostgreSQL database and a private
Redis running docker/redis's ACL file (the web side as user ``web``, the
gpuworker as ``worker``). One test: a streamed completion over the API,
then an invoice for it built by the Celery worker, beat's schedule reaching
the worker, and no command refused by the ACL along the way.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from datetime import date, timedelta
from decimal import Decimal
from pathlib import Path

import pytest
from django.conf import settings

from tests.deploy.redis_acl import start_acl_redis
from tests.plugins.topology import free_port
from tests.plugins.topology import test_db_url as database_url

ROOT = Path(__file__).resolve().parents[2]
START_TIMEOUT = 300

# Transactional: what the test writes (tenant, key, a backdated usage record)
# must be committed for the processes under test to see it.
pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]


def wait_ready(
    base: str, proc: subprocess.Popen, log: Path, timeout: float = START_TIMEOUT
) -> None:
    """Until the web's /readyz says a worker serves every model."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"{' '.join(proc.args)} exited:\n{log.read_text()[-6000:]}")
        try:
            with urllib.request.urlopen(f"{base}/readyz", timeout=3) as response:
                if response.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(1)
    pytest.fail(f"never ready:\n{log.read_text()[-6000:]}")


def stream_completion(base: str, key: str) -> tuple[str, str]:
    body = {
        "model": settings.DEMO_MODEL_NAME,
        "messages": [{"role": "user", "content": "Say hello."}],
        "max_tokens": 8,
        "temperature": 0,
        "stream": True,
    }
    request = urllib.request.Request(
        f"{base}/v1/chat/completions",
        data=json.dumps(body).encode(),
        headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"},
    )
    response_id, text, done = "", [], False
    with urllib.request.urlopen(request, timeout=120) as response:
        assert response.headers["Content-Type"].startswith("text/event-stream")
        for raw in response:
            line = raw.decode().strip()
            if not line.startswith("data: "):
                continue
            if line == "data: [DONE]":
                done = True
                break
            chunk = json.loads(line[6:])
            response_id = chunk["id"]
            text += [c["delta"].get("content") or "" for c in chunk["choices"]]
    assert done
    return response_id, "".join(text)


def celery_call(env: dict[str, str], code: str) -> dict:
    """Send a task the way the web does (settings' broker, as the web user)."""
    script = f"import django, json; django.setup()\n{code}"
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True, text=True,
        timeout=180,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_topology_serves_a_streamed_completion_and_celery_invoices_it(
    tiers, django_db_blocker, tmp_path
):
    if "postgresql" not in settings.DATABASES["default"]["ENGINE"]:
        pytest.skip("the topology runs on PostgreSQL (DATABASE_URL)")
    from billing.models import Invoice, UsageRecord
    from fleet.services import served_model_register
    from tenants.models import Tenant
    from tenants.services import api_key_create, tenant_create

    acl, redis_proc = start_acl_redis(tmp_path)
    suffix = uuid.uuid4().hex[:8]
    with django_db_blocker.unblock():
        # seed_demo (bin/run) makes the "demo" tenant; keep only one it found.
        demo_existed = Tenant.objects.filter(name="demo").exists()
        served_model_register(name=settings.DEMO_MODEL_NAME, context_length=8192)
        tenant = tenant_create(name=f"topology-{suffix}", tier_name="pro")
        _, key = api_key_create(tenant=tenant, name="topology")

    port = free_port()
    base = f"http://127.0.0.1:{port}"
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("REDIS_", "CELERY_"))},
        "DATABASE_URL": database_url(),
        "REDIS_URL": acl.url(),
        "REDIS_USERNAME": "web",
        "REDIS_PASSWORD": acl.web_password,
        "WORKER_REDIS_USERNAME": "worker",
        "WORKER_REDIS_PASSWORD": acl.worker_password,
        "PORT": str(port),
        "DEMO_ADMIN_USER": f"topology-admin-{suffix}",
        "DEMO_API_KEY_FILE": str(tmp_path / "demo-api-key"),
        "CELERY_CONCURRENCY": "1",
        "CELERY_BEAT_SCHEDULE_FILE": str(tmp_path / "celerybeat-schedule"),
        "ENGINE_KV_CACHE_MB": "64",
        "LOG_LEVEL": "INFO",
    }
    log = tmp_path / "topology.log"
    proc = subprocess.Popen(
        ["bin/run", "--topology"], cwd=ROOT, env=env, stdout=log.open("w"),
        stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip
    try:
        wait_ready(base, proc, log)
        response_id, text = stream_completion(base, key)
        assert response_id and text

        with django_db_blocker.unblock():
            record = UsageRecord.objects.get(response_id=response_id)
            assert record.tenant_id == tenant.pk and record.completion_tokens > 0
            # Invoices bill closed months: the record moves to last month.
            last_month = date.today().replace(day=1) - timedelta(days=1)
            UsageRecord.objects.filter(pk=record.pk).update(
                created_at=record.created_at - timedelta(days=date.today().day + 1)
            )
        issued = celery_call(
            env | {"REDIS_URL": acl.url()},
            "from billing.tasks import invoice_issue\n"
            f"print(json.dumps(invoice_issue.delay({tenant.pk}, '{last_month.isoformat()}')"
            ".get(timeout=120)))",
        )
        with django_db_blocker.unblock():
            invoice = Invoice.objects.get(tenant=tenant, period=last_month.replace(day=1))
            line = invoice.lines.get()
            assert issued["number"] == invoice.number and Decimal(issued["total"]) == invoice.total
            assert (line.model, line.requests) == (settings.DEMO_MODEL_NAME, 1)
            assert (line.prompt_tokens, line.completion_tokens) == (
                record.prompt_tokens,
                record.completion_tokens,
            )
            # A few tokens at demo prices round to cents: the line is priced.
            assert line.price.completion_per_million > 0

        # Beat's schedule reaches the worker: the usage settler runs every 5 s.
        deadline = time.monotonic() + 60
        while "billing.tasks.usage_settle" not in log.read_text():
            assert time.monotonic() < deadline, log.read_text()[-4000:]
            time.sleep(1)
        assert acl.denials() == [], acl.denials()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)
        redis_proc.terminate()
        redis_proc.wait(10)
        with django_db_blocker.unblock():
            UsageRecord.objects.filter(tenant=tenant).delete()  # before the invoice (PROTECT)
            Invoice.objects.filter(tenant=tenant).delete()
            Tenant.objects.filter(pk=tenant.pk).delete()
            if not demo_existed:
                Tenant.objects.filter(name="demo").delete()
            from django.contrib.auth import get_user_model

            get_user_model().objects.filter(username=env["DEMO_ADMIN_USER"]).delete()
