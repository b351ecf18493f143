"""Celery tasks for billing (queue "billing") and GPU accounting (queue "fleet").

Thin: parse arguments, call a service. Every task is safe to run twice or
concurrently (acks_late redelivers a task whose worker died): invoices are
unique per tenant and month, roll-ups rebuild their day, alerts go out once
per tenant and month, GPU samples are deltas of cumulative counters,
usage entries are acknowledged only after their record is written (and the
record is unique per response).
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
from datetime import date, timedelta

from celery import shared_task
from django.conf import settings
from django.utils import timezone

from billing.selectors.budgets import month_start
from billing.selectors.invoices import MissingPrice
from billing.selectors.reports import csv_text, gpu_cost_report
from billing.services import budget_alerts, gpu, invoices, rollups, settlement
from tenants.models import Tenant
from wire.bus import get_bus

logger = logging.getLogger(__name__)


def _date(value: str | None, default: date) -> date:
    return date.fromisoformat(value) if value else default


@shared_task
def daily_usage_rollup(day: str | None = None) -> dict[str, int]:
    """Roll up ``day`` (ISO), or yesterday and today when None."""
    today = timezone.now().date()
    days = [date.fromisoformat(day)] if day else [today - timedelta(days=1), today]
    return {d.isoformat(): rollups.daily_usage_rollup(day=d) for d in days}


@shared_task
def invoice_issue(tenant_id: int, period: str) -> dict:
    """Issue one tenant's invoice for the month of ``period`` (ISO date)."""
    try:
        invoice, created = invoices.invoice_issue(
            tenant_id=tenant_id, period=date.fromisoformat(period)
        )
    except MissingPrice:
        logger.exception("invoice of tenant %s for %s not issued", tenant_id, period)
        raise
    return {"number": invoice.number, "total": str(invoice.total), "created": created}


@shared_task
def invoices_issue_monthly(period: str | None = None) -> list[int]:
    """Enqueue the invoice of every tenant with usage last month (or ``period``'s month)."""
    last_month = month_start(month_start(timezone.now().date()) - timedelta(days=1))
    billed = _date(period, last_month)
    tenant_ids = invoices.tenants_to_invoice(period=billed)
    for tenant_id in tenant_ids:
        invoice_issue.delay_on_commit(tenant_id, billed.isoformat())
    return tenant_ids


def settler_name(kind: str) -> str:
    """This process's consumer name in the settlers' group."""
    return f"{kind}:{socket.gethostname()}:{os.getpid()}"


@shared_task
def usage_settle() -> dict[str, int]:
    """Settle the usage stream's entries into records (beat, every few seconds)."""
    report = settlement.usage_settle_pending(consumer=settler_name("celery"))
    return {"recorded": report.recorded, "known": report.known, "dead": report.dead}


@shared_task
def budgets_check() -> dict[int, list[str]]:
    """Email due budget alerts and correct the spend counters, for every tenant with a budget."""
    sent = {}
    for tenant in Tenant.objects.filter(monthly_budget__isnull=False, is_active=True):
        kinds = budget_alerts.budget_check(tenant=tenant)
        if kinds:
            sent[tenant.pk] = kinds
    return sent


async def _live_workers():
    bus = get_bus()
    try:
        return await bus.list_workers()
    finally:
        if settings.REDIS_URL:
            await bus.close()


@shared_task
def gpu_usage_sample() -> int:
    """Sample the busy/idle counters of every live worker (routed to the fleet queue)."""
    return gpu.gpu_usage_sample(workers=asyncio.run(_live_workers()))


@shared_task(bind=True)
def gpu_cost_report_build(self, start: str, end: str) -> list[dict]:
    """The GPU cost report for ``start``..``end`` (ISO, inclusive), with progress per day."""

    def progress(done: int, total: int) -> None:
        self.update_state(state="PROGRESS", meta={"done": done, "total": total})

    rows = gpu_cost_report(
        start=date.fromisoformat(start), end=date.fromisoformat(end), on_progress=progress
    )
    return [{key: csv_text(value) for key, value in r.as_dict().items()} for r in rows]
