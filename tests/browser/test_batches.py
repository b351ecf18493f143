"""The console's Batches page in a real browser, on the real topology plus a
Celery worker feeding batch lines: a tenant admin uploads a file, starts a
batch, watches it complete (progress polled), and finds its output file.
Screenshot: test-output/screenshots/batches.png.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from django.conf import settings

from tests.browser.conftest import screenshot
from tests.plugins import topology as topo

pytestmark = [pytest.mark.browser, pytest.mark.slow, pytest.mark.django_db]


@pytest.fixture(scope="module")
def batches_worker(topology, tmp_path_factory):
    """A Celery worker on the batches queue of the topology's Redis and database."""
    procs = topo.Processes(tmp_path_factory.mktemp("batches-celery"))
    env = topo.base_env(DATABASE_URL=topo.test_db_url(), REDIS_URL=topo.redis_url())
    cmd = [sys.executable, "-m", "celery", "-A", "config.celery_app", "worker"]
    procs.start("celery", [*cmd, "-Q", "batches", "--pool", "threads", "-l", "warning"], env)
    yield procs
    procs.stop()


@pytest.fixture(scope="module")
def key_name(console_site, django_db_blocker):
    """A key of the admin's tenant to run the batch with."""
    from tenants.models import Tenant
    from tenants.services import api_key_create

    with django_db_blocker.unblock():
        key, _ = api_key_create(
            tenant=Tenant.objects.get(pk=console_site.tenant_id), name="batches"
        )
    return str(key)


def test_an_admin_runs_a_batch_from_the_console(
    page, console_site, batches_worker, key_name, tmp_path
):
    lines = [
        {
            "custom_id": f"q{i}",
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": {
                "model": settings.DEMO_MODEL_NAME,
                "messages": [{"role": "user", "content": question}],
                "max_tokens": 8,
            },
        }
        for i, question in enumerate(["Name a colour.", "Say hello."])
    ]
    upload = tmp_path / "requests.jsonl"
    upload.write_text("".join(json.dumps(line) + "\n" for line in lines))
    page.goto("/accounts/login/?next=/batches/")
    page.fill('input[name="username"]', console_site.username)
    page.fill('input[name="password"]', console_site.password)
    page.click('button[type="submit"]')
    page.wait_for_url("**/batches/")
    page.set_input_files('input[name="file"]', str(upload))
    page.select_option('select[name="endpoint"]', "/v1/chat/completions")
    page.select_option('select[name="api_key"]', label=key_name)
    page.click("#batch-form button[type=submit]")
    page.wait_for_url("**/batches/")
    row = page.locator("#batches tr[data-batch]").first
    # The page polls progress.json and reloads once the batch is done.
    page.wait_for_function(
        "() => document.querySelector('#batches tr[data-batch]').dataset.status === 'completed'",
        timeout=180_000,
    )
    assert "2 done, 0 failed of 2" in row.inner_text()
    output = row.locator("a", has_text="output")
    assert output.count() == 1
    screenshot(page, "batches")
    with page.expect_download() as download:
        output.click()
    path = download.value.path()
    records = [json.loads(line) for line in Path(path).read_text().splitlines()]
    assert sorted(r["custom_id"] for r in records) == ["q0", "q1"]
    assert all(r["response"]["status_code"] == 200 for r in records)
