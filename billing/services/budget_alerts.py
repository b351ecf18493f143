"""Budget alerts: the soft and hard emails, once per tenant and month each."""

from __future__ import annotations

import logging
from datetime import date
from decimal import Decimal

from django.conf import settings
from django.core.mail import send_mail
from django.db import transaction
from django.utils import timezone

from billing.models import BudgetAlert, BudgetPolicy
from billing.selectors.budgets import month_spend, month_start
from billing.services.budgets import spend_catch_up
from tenants.models import Membership, Tenant

logger = logging.getLogger(__name__)


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
    spend_catch_up(tenant=tenant, period=period, spend=spend)
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
