"""Budgets: the month's spend counter, the hard stop and the emailed alerts.

The request path reads the spend from one cache key per tenant and month
(Redis when configured), kept in nano-units of the billing currency so it
can be incremented atomically. Each new UsageRecord adds its cost once it
is committed; a missing key (expired, Redis flushed) is re-seeded from the
records. The periodic budget check recomputes the exact spend and raises
the counter if it ever fell behind.
"""

from __future__ import annotations

import logging
from datetime import UTC, date
from decimal import ROUND_HALF_UP, Decimal

from asgiref.sync import sync_to_async
from django.conf import settings
from django.core.cache import cache
from django.core.mail import send_mail
from django.db import transaction
from django.utils import timezone
from redis.exceptions import RedisError

from billing.models import BudgetAlert, BudgetPolicy, UsageRecord
from billing.selectors.budgets import month_spend, month_start
from billing.selectors.pricing import BILLABLE_STATUSES, PriceBook
from tenants.models import Membership, Tenant

logger = logging.getLogger(__name__)

NANO = Decimal("0.000000001")
# Longer than any month, so a counter outlives the month it counts.
COUNTER_TTL = 40 * 24 * 3600


class BudgetExhausted(Exception):
    """The tenant's monthly budget is spent (the API answers 429 insufficient_quota)."""

    def __init__(self, message: str):
        super().__init__(message)
        self.message = message


def spend_cache_key(tenant_id: int, salt: str, period: date) -> str:
    # The tenant's random salt keeps a counter from outliving its tenant row
    # (a database restored or reset under a Redis that was not).
    return f"billing:spend:{tenant_id}:{salt[:12]}:{period:%Y%m}"


def _to_nano(amount: Decimal) -> int:
    return int((amount / NANO).to_integral_value(rounding=ROUND_HALF_UP))


def _seed(tenant: Tenant, period: date) -> int:
    nano = _to_nano(month_spend(tenant=tenant, period=period))
    key = spend_cache_key(tenant.pk, tenant.cache_salt, period)
    # add, not set: a concurrent increment that got there first wins.
    if not cache.add(key, nano, timeout=COUNTER_TTL):
        return int(cache.get(key, nano))
    return nano


def _spend(tenant: Tenant) -> Decimal:
    period = month_start(timezone.now().date())
    nano = cache.get(spend_cache_key(tenant.pk, tenant.cache_salt, period))
    if nano is None:
        nano = _seed(tenant, period)
    return Decimal(nano) * NANO


def spend_this_month(*, tenant_id: int) -> Decimal:
    """The tenant's spend this month from the counter (seeded when missing)."""
    return _spend(Tenant.objects.get(pk=tenant_id))


def spend_record(*, record: UsageRecord) -> None:
    """Add a new record's cost to its tenant's counter (call once, after commit)."""
    if record.status not in BILLABLE_STATUSES:
        return
    day = record.created_at.astimezone(UTC).date()
    tenant = Tenant.objects.only("tier_id", "cache_salt").get(pk=record.tenant_id)
    cost = PriceBook.for_tier(tenant.tier_id, models=[record.model]).cost(
        record.model,
        day,
        prompt_tokens=record.prompt_tokens,
        cached_tokens=record.cached_tokens,
        completion_tokens=record.completion_tokens,
    )
    period = month_start(day)
    try:
        cache.incr(spend_cache_key(tenant.pk, tenant.cache_salt, period), _to_nano(cost))
    except ValueError:
        # No counter yet: seeding reads the committed records, this one included.
        _seed(tenant, period)


def _budget_check_sync(tenant_id: int) -> None:
    tenant = (
        Tenant.objects.only("tier_id", "cache_salt", "monthly_budget").filter(pk=tenant_id).first()
    )
    if tenant is None or tenant.monthly_budget is None:
        return
    budget, spent = tenant.monthly_budget, _spend(tenant)
    if spent >= budget:
        raise BudgetExhausted(
            f"Your organization's monthly budget of {budget:.2f} {settings.BILLING_CURRENCY} "
            f"is exhausted ({spent:.2f} {settings.BILLING_CURRENCY} spent this month). "
            "Raise the budget or wait for next month."
        )


async def budget_admit(*, tenant_id: int) -> None:
    """Refuse a new request once the tenant's spend this month reaches its budget.

    Async (call it with ``await`` on the request path). Raises
    ``BudgetExhausted`` (the API's 429 ``insufficient_quota``). Costs one primary-key
    read and one cache read. Requests admitted earlier are not affected:
    they finish and are recorded and billed, so the final spend may pass the
    budget by what was already running.
    """
    try:
        await sync_to_async(_budget_check_sync)(tenant_id)
    except RedisError:
        # The rate limiter, next on the path, answers 503 for the same outage.
        logger.warning("budget check of tenant %s skipped: cache unavailable", tenant_id)


def _recipients(tenant: Tenant) -> list[str]:
    admins = Membership.objects.filter(tenant=tenant, role=Membership.Role.ADMIN).exclude(
        user__email=""
    )
    emails = sorted({m.user.email for m in admins.select_related("user")})
    policy = BudgetPolicy.objects.filter(tenant=tenant).first()
    if policy is not None and policy.alert_email and policy.alert_email not in emails:
        emails.append(policy.alert_email)
    return emails


def _share(spend: Decimal, budget: Decimal) -> Decimal:
    return spend / budget if budget else Decimal(1)


def _alert(tenant: Tenant, period: date, kind: str, spend: Decimal) -> bool:
    """Record and email one alert; False when it was sent before."""
    currency = settings.BILLING_CURRENCY
    recipients = _recipients(tenant)
    with transaction.atomic():
        alert, created = BudgetAlert.objects.get_or_create(
            tenant=tenant,
            period=period,
            kind=kind,
            defaults={
                "spend": spend,
                "budget": tenant.monthly_budget,
                "recipients": ", ".join(recipients),
            },
        )
        if not created:
            return False
        # Inside the transaction: a failed send rolls the row back and the
        # next check retries, so an alert is never recorded but unsent.
        if recipients:
            subject = (
                f"[{tenant.name}] Monthly budget exhausted: new requests are refused"
                if kind == BudgetAlert.Kind.HARD
                else f"[{tenant.name}] {_share(spend, tenant.monthly_budget):.0%} of the monthly budget used"
            )
            body = (
                f"{tenant.name} has spent {spend:.2f} {currency} of its monthly budget of "
                f"{tenant.monthly_budget:.2f} {currency} for {period:%B %Y}.\n"
            )
            if kind == BudgetAlert.Kind.HARD:
                body += "API requests are refused with 429 insufficient_quota until the budget is raised.\n"
            send_mail(subject, body, settings.DEFAULT_FROM_EMAIL, recipients)
        else:
            logger.warning("budget alert for %s: no admin email to send it to", tenant)
    return True


def budget_check(*, tenant: Tenant, today: date | None = None) -> list[str]:
    """Send the month's soft and hard alerts due for ``tenant``; returns the kinds sent.

    Recomputes the exact spend and raises the request path's counter to it
    if the counter fell behind. Safe to rerun: each alert goes out once per
    tenant and month.
    """
    if tenant.monthly_budget is None:
        return []
    period = month_start(today or timezone.now().date())
    spend = month_spend(tenant=tenant, period=period)
    key = spend_cache_key(tenant.pk, tenant.cache_salt, period)
    counted = cache.get(key)
    if counted is None or int(counted) < _to_nano(spend):
        cache.set(key, _to_nano(spend), timeout=COUNTER_TTL)
    policy = BudgetPolicy.objects.filter(tenant=tenant).first()
    ratio = policy.soft_alert_ratio if policy else BudgetPolicy.DEFAULT_SOFT_ALERT_RATIO
    sent = []
    if spend >= tenant.monthly_budget * ratio and _alert(
        tenant, period, BudgetAlert.Kind.SOFT, spend
    ):
        sent.append(BudgetAlert.Kind.SOFT)
    if spend >= tenant.monthly_budget and _alert(tenant, period, BudgetAlert.Kind.HARD, spend):
        sent.append(BudgetAlert.Kind.HARD)
    return sent
