"""Browser fixtures: Debian's headless Chromium driven by Playwright, against
the real topology of tests/e2e (Daphne + gpuworker + PostgreSQL + Redis).

Playwright's own browser download cannot work here; .ci/run installs the
``chromium`` Debian package and the tests launch /usr/bin/chromium.
"""

from __future__ import annotations

import os
import shutil
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.plugins.topology import ROOT

CHROMIUM = os.environ.get("CHROMIUM_PATH", "/usr/bin/chromium")
SCREENSHOTS = ROOT / "test-output" / "screenshots"
PASSWORD = "browser-pw-1"


@dataclass
class Console:
    base_url: str
    username: str
    password: str
    tenant_id: int
    worker_id: str


@pytest.fixture(scope="module", autouse=True)
def short_replies():
    """Cap console replies for the servers the module starts (they inherit
    the environment): sampling is random, and a reply that runs to the
    default 1024 tokens takes minutes on a shared CPU."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("CONSOLE_MAX_OUTPUT_TOKENS", "96")
        yield


@pytest.fixture(scope="module")
def console_site(topology, django_db_blocker) -> Console:  # noqa: F811
    """A member of the topology's pro tenant who can sign in to its Daphne."""
    from django.contrib.auth import get_user_model

    from tenants.models import Tenant
    from tenants.services import membership_create

    pro_tenant_id = topology.tenant_ids[0]
    username = f"browser-{os.urandom(3).hex()}"
    with django_db_blocker.unblock():
        user = get_user_model().objects.create_user(username=username, password=PASSWORD)
        membership_create(user=user, tenant=Tenant.objects.get(pk=pro_tenant_id), role="admin")
    base = topology.base_url.removesuffix("/v1")
    yield Console(base, username, PASSWORD, pro_tenant_id, topology.worker_id)
    with django_db_blocker.unblock():
        get_user_model().objects.filter(username=username).delete()


@contextmanager
def launched_chromium():
    """Debian's headless Chromium under Playwright, for as long as the block runs.

    Start it after any fixture that writes to the database: Playwright's
    sync API runs an event loop in this thread, and Django refuses database
    calls while one is running.
    """
    if not Path(CHROMIUM).exists() or shutil.which(CHROMIUM) is None:
        pytest.fail(f"{CHROMIUM} is missing: apt-get install -y chromium (.ci/run does)")
    from playwright.sync_api import sync_playwright

    # pytest-django wraps each test in a transaction; with Playwright's loop
    # running in this thread Django would refuse to, though nothing here
    # shares a connection with that loop.
    previous = os.environ.get("DJANGO_ALLOW_ASYNC_UNSAFE")
    os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"
    try:
        with sync_playwright() as playwright:
            # --no-sandbox: CI runs as root, where Chromium's sandbox refuses to start.
            browser = playwright.chromium.launch(
                executable_path=CHROMIUM, headless=True, args=["--no-sandbox"]
            )
            yield browser
            browser.close()
    finally:
        if previous is None:
            os.environ.pop("DJANGO_ALLOW_ASYNC_UNSAFE", None)
        else:
            os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = previous


@pytest.fixture(scope="module")
def chromium(console_site):
    # After console_site: see launched_chromium.
    with launched_chromium() as browser:
        yield browser


@pytest.fixture(scope="module")
def page(console_site, chromium):
    """One signed-out browser page for the module's tests, run in order."""
    context = chromium.new_context(
        base_url=console_site.base_url, viewport={"width": 1280, "height": 860}
    )
    context.set_default_timeout(30_000)
    page = context.new_page()
    yield page
    context.close()


def screenshot(page, name: str) -> Path:
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    path = SCREENSHOTS / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    return path
