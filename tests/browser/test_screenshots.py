"""Every console page in a real browser, with a screenshot of each.

A staff user who is also the pro tenant's admin (so every page is open to
them) signs in to the real topology of tests/e2e, with data on every page:
a conversation, usage today and last month, an invoice, a GPU usage sample,
a pending invitation. Each page must answer with its status, log no browser
error (a missing script or stylesheet is one) and fit the window's width;
its full-page PNG goes to test-output/screenshots/pages/ (git-ignored) for
a person to look at. The signed-out pages (sign-in, invitations, the
lock-out after failed sign-ins) and one for a user in no tenant come too.
"""

from __future__ import annotations

import os
import uuid
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from pathlib import Path

import pytest
from django.conf import settings

from tests.browser.conftest import SCREENSHOTS

pytestmark = [pytest.mark.browser, pytest.mark.slow, pytest.mark.django_db]

PAGES = SCREENSHOTS / "pages"
PASSWORD = "screenshots-pw-1"
# What overflows a 1280-pixel window sideways is a layout bug, except in
# pages that are not ours.
NOT_OURS = ("/admin/", "/v1/docs")


def _record(tenant_id: int, *, created_at: datetime | None = None, completion: int = 40):
    from tests.usage_records import record_usage

    return record_usage(
        response_id=f"chatcmpl-{uuid.uuid4().hex}",
        tenant_id=tenant_id,
        model=settings.DEMO_MODEL_NAME,
        source="console",
        status="completed",
        finish_reason="stop",
        prompt_tokens=120,
        cached_tokens=0,
        completion_tokens=completion,
        queue_time_ms=3,
        ttft_ms=180,
        duration_ms=900,
        worker_id="screenshots",
        created_at=created_at,
    )[0]


@pytest.fixture(scope="module")
def site(topology, django_db_blocker):
    """The staff admin, and the ids of what the pages show."""
    from django.contrib.auth import get_user_model

    from billing.models import Invoice, Price, UsageRecord
    from billing.services import gpu_usage_sample, invoice_issue, price_set
    from console.models import Conversation, Message
    from tenants.models import ApiKey, Tenant, Tier
    from tenants.services import invitation_create, membership_create
    from wire.workers import WorkerInfo, WorkerState

    suffix = os.urandom(3).hex()
    tenant_id = topology.tenant_ids[0]
    with django_db_blocker.unblock():
        users = get_user_model().objects
        tenant = Tenant.objects.get(pk=tenant_id)
        admin = users.create_superuser(f"staff-{suffix}", password=PASSWORD)
        membership_create(user=admin, tenant=tenant, role="admin")
        loner = users.create_user(f"loner-{suffix}", password=PASSWORD)
        conversation = Conversation.objects.create(
            tenant=tenant, user=admin, title="Colors of the rainbow", model=settings.DEMO_MODEL_NAME
        )
        Message.objects.create(
            conversation=conversation, role="user", content="Name three colors of the rainbow."
        )
        Message.objects.create(
            conversation=conversation,
            role="assistant",
            status="completed",
            content="Red, orange and yellow.",
            model=settings.DEMO_MODEL_NAME,
            prompt_tokens=31,
            completion_tokens=7,
        )
        today = datetime.now(UTC)
        last_month = today.replace(day=1) - timedelta(days=3)
        price_set(
            model=settings.DEMO_MODEL_NAME,
            tier=Tier.objects.get(name="pro"),
            effective_from=date(2020, 1, 1),
            prompt_per_million=Decimal("0.10"),
            cached_prompt_per_million=Decimal("0.05"),
            completion_per_million=Decimal("0.40"),
        )
        for days in range(4):
            _record(tenant_id, created_at=today - timedelta(days=days), completion=40 + 15 * days)
        _record(tenant_id, created_at=last_month)
        invoice, _ = invoice_issue(tenant_id=tenant_id, period=last_month.date())
        sampled = WorkerInfo(
            worker_id=f"screenshots-{suffix}",
            model=settings.DEMO_MODEL_NAME,
            state=WorkerState.READY,
            extra={"boot_id": suffix, "busy_seconds": 1800.0, "idle_seconds": 600.0,
                   "hourly_price": "2.5"},
        )  # fmt: skip
        gpu_usage_sample(workers=[sampled], now=today)
        invitation, token = invitation_create(
            tenant=tenant, email=f"newcomer-{suffix}@example.com", invited_by=admin
        )
        key = ApiKey.objects.filter(tenant=tenant).first()
    yield {
        "admin": admin.username,
        "loner": loner.username,
        "conversation": conversation.pk,
        "invoice": invoice.number,
        "token": token,
        "key": key.pk,
    }
    with django_db_blocker.unblock():
        # Records first: each keeps the invoice that billed it (PROTECT).
        UsageRecord.objects.filter(tenant_id=tenant_id).delete()
        Invoice.objects.filter(tenant_id=tenant_id).delete()
        Price.objects.filter(effective_from=date(2020, 1, 1)).delete()
        users.filter(username__in=[admin.username, loner.username]).delete()


class Visitor:
    """One browser context (its own cookies) that photographs what it opens."""

    def __init__(self, browser, base_url: str):
        self.context = browser.new_context(
            base_url=base_url, viewport={"width": 1280, "height": 860}
        )
        self.context.set_default_timeout(30_000)
        self.page = self.context.new_page()
        self.errors: list[str] = []
        self.page.on("pageerror", lambda exc: self.errors.append(f"page error: {exc}"))
        self.page.on(
            "console",
            lambda msg: self.errors.append(f"console: {msg.text}") if msg.type == "error" else None,
        )
        # Which resource failed, since the console message does not say.
        self.page.on(
            "response",
            lambda r: (
                self.errors.append(f"{r.status} {r.url}")
                if r.status >= 400 and r.request.resource_type != "document"
                else None
            ),
        )

    def sign_in(self, username: str, password: str = PASSWORD) -> None:
        self.page.goto("/accounts/login/")
        self.page.fill('input[name="username"]', username)
        self.page.fill('input[name="password"]', password)
        self.page.click('button[type="submit"]')
        self.page.wait_for_load_state("networkidle")

    def shoot(self, name: str, path: str, *, status: int = 200, ready: str | None = None) -> Path:
        """Open ``path``, check it, save its screenshot as ``name``.png."""
        self.errors.clear()
        response = self.page.goto(path)
        assert response is not None and response.status == status, (
            path,
            response and response.status,
        )
        self.page.wait_for_load_state("networkidle")
        if ready:
            self.page.wait_for_function(ready)
        # Chromium reports failed loads (a 404 script) as console errors; a
        # page meant to answer 404 or 409 logs its own status too.
        own = f"console: Failed to load resource: the server responded with a status of {status}"
        errors = [e for e in self.errors if not (status >= 400 and e.startswith(own))]
        assert errors == [], (path, errors)
        if not path.startswith(NOT_OURS):
            overflow = self.page.evaluate(
                "document.documentElement.scrollWidth - document.documentElement.clientWidth"
            )
            assert overflow <= 0, f"{path} is {overflow}px wider than the window"
        PAGES.mkdir(parents=True, exist_ok=True)
        shot = PAGES / f"{name}.png"
        self.page.screenshot(path=str(shot), full_page=True)
        return shot

    def close(self) -> None:
        self.context.close()


CHARTS_DRAWN = "() => window.usageCharts && window.usageCharts.length === 2"


def test_every_console_page_renders(topology, site, chromium):
    # site before chromium: Playwright's loop then runs in this thread.
    browser = chromium
    base = topology.base_url.removesuffix("/v1")
    shots = []

    visitor = Visitor(browser, base)
    try:
        shots.append(visitor.shoot("home", "/"))
        shots.append(visitor.shoot("login", "/accounts/login/"))
        shots.append(visitor.shoot("invitation-accept", f"/invitations/{site['token']}/"))
        shots.append(visitor.shoot("invitation-invalid", "/invitations/not-a-token/", status=404))
        shots.append(
            visitor.shoot(
                "api-docs", "/v1/docs", ready="() => !!document.querySelector('.swagger-ui .info')"
            )
        )
        visitor.sign_in(site["admin"])
        pages = [
            ("chat-new", "/chat/", None),
            ("chat-conversation", f"/chat/{site['conversation']}/", None),
            ("api-keys", "/api-keys/", None),
            ("usage-by-model", "/usage/", CHARTS_DRAWN),
            ("usage-by-key", "/usage/?days=7&by=api_key", CHARTS_DRAWN),
            ("team", "/team/", None),
            ("key-limits", f"/team/keys/{site['key']}/limits/", None),
            ("safety", "/safety/", None),
            ("audit", "/audit/", None),
            ("fleet", "/fleet/", None),
            ("capacity", "/fleet/capacity/", None),
            ("gpu-report", "/billing/gpu/", None),
            ("report-run", f"/billing/runs/{uuid.uuid4()}/", None),
            ("invoices", "/billing/invoices/", None),
            ("invoice", f"/billing/invoices/{site['invoice']}/", None),
            ("admin", "/admin/", None),
            ("admin-audit-log", "/admin/auditlog/logentry/", None),
        ]
        for name, path, ready in pages:
            shots.append(visitor.shoot(name, path, ready=ready))
        shots.append(
            visitor.shoot("invitation-signed-in", f"/invitations/{site['token']}/", status=409)
        )
        # Costs carry the currency, on the page and on the chart's axis.
        visitor.page.goto("/usage/")
        assert f" {settings.BILLING_CURRENCY}" in visitor.page.inner_text("#usage-table")
    finally:
        visitor.close()

    loner = Visitor(browser, base)
    try:
        loner.sign_in(site["loner"])
        shots.append(loner.shoot("no-tenant", "/chat/", status=403))
    finally:
        loner.close()

    intruder = Visitor(browser, base)
    name = f"intruder-{site['admin']}"
    try:
        for _ in range(settings.AXES_FAILURE_LIMIT):
            intruder.sign_in(name, "wrong")
        assert "Too many sign-in attempts" in intruder.page.content()
        PAGES.mkdir(parents=True, exist_ok=True)
        intruder.page.screenshot(path=str(PAGES / "locked-out.png"), full_page=True)
        shots.append(PAGES / "locked-out.png")
    finally:
        intruder.close()
        from axes.models import AccessAttempt, AccessFailureLog

        AccessAttempt.objects.filter(username=name).delete()
        AccessFailureLog.objects.filter(username=name).delete()

    assert all(shot.stat().st_size > 5_000 for shot in shots), shots
