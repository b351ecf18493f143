"""Budgets on the request path: reserve the worst case, settle the actual.

``budget_reserve`` runs at admission: for a tenant with a monthly budget it
prices the request's worst case (every prompt token uncached, every
completion token used, at the price in force for the tier and model) and
holds it in the budget ledger in one atomic step, refusing when settled
spend + holds in flight + this request would pass the budget. So however
many requests arrive at once, what they can be billed together stays
within the budget. ``budget_renew`` keeps the hold's lease alive while the
response runs; ``budget_settle`` at its end moves the hold to the spend at
what the response is billed (nothing for a failed one, the hold released
for one that never ran). A hold whose owner died expires with its lease.

Amounts are nano-units of the billing currency (integers, so the ledger
can add them atomically); worst cases round up, costs half up.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from datetime import UTC, date
from decimal import ROUND_CEILING, ROUND_HALF_UP, Decimal

from asgiref.sync import sync_to_async
from django.conf import settings
from django.utils import timezone
from redis.exceptions import RedisError

from billing import ledger
from billing.models import Price
from billing.models.pricing import service_tier_multiplier
from billing.selectors.budgets import month_spend, month_start
from billing.selectors.pricing import BILLABLE_STATUSES, price_in_force
from tenants.models import Tenant

logger = logging.getLogger(__name__)

NANO = Decimal("0.000000001")


class BudgetExhausted(Exception):
    """The tenant's monthly budget is spent (the API answers 429 insufficient_quota)."""

    def __init__(self, message: str):
        super().__init__(message)
        self.message = message


class BudgetUnavailable(Exception):
    """The budget cannot be checked (Redis unreachable, or PostgreSQL down with
    nothing to check against) and the tenant chose to refuse then (503)."""


def _to_nano(amount: Decimal, rounding: str = ROUND_HALF_UP) -> int:
    return int((amount / NANO).to_integral_value(rounding=rounding))


def account_name(*, tenant_id: int, salt: str, day: date) -> str:
    # The tenant's random salt keeps an account from outliving its tenant
    # row (a database restored or reset under a Redis that was not).
    return f"{tenant_id}:{salt[:12]}:{day:%Y%m}"


@dataclass(slots=True, frozen=True)
class Rates:
    """A price's unit prices per 1M tokens, as the hold carries them."""

    price_id: int
    prompt: Decimal
    cached: Decimal
    completion: Decimal
    # The price's service-tier multipliers, and the tier this hold is for.
    priority: Decimal = Decimal(1)
    flex: Decimal = Decimal(1)
    service_tier: str = "default"

    @classmethod
    def of(cls, price: Price, *, service_tier: str = "default") -> Rates:
        return cls(
            price.pk,
            price.prompt_per_million,
            price.cached_prompt_per_million,
            price.completion_per_million,
            price.priority_multiplier,
            price.flex_multiplier,
            service_tier,
        )

    def encode(self) -> str:
        # The price alone: the ledger remembers it per model, for any tier.
        return (
            f"{self.price_id}|{self.prompt}|{self.cached}|{self.completion}"
            f"|{self.priority}|{self.flex}"
        )

    @classmethod
    def decode(cls, text: str, *, service_tier: str = "default") -> Rates:
        parts = text.split("|")
        # Four parts: remembered before the multipliers (each then 1).
        price_id, prompt, cached, completion, *multipliers = parts
        priority, flex = multipliers or ("1", "1")
        return cls(
            int(price_id),
            Decimal(prompt),
            Decimal(cached),
            Decimal(completion),
            Decimal(priority),
            Decimal(flex),
            service_tier,
        )

    def scaled(self, multiplier: Decimal) -> Rates:
        """These rates at ``multiplier`` of themselves (batch usage's discount)."""
        if multiplier == 1:
            return self
        return replace(
            self,
            prompt=self.prompt * multiplier,
            cached=self.cached * multiplier,
            completion=self.completion * multiplier,
        )

    def cost(self, *, prompt_tokens: int, cached_tokens: int, completion_tokens: int) -> Decimal:
        multiplier = service_tier_multiplier(
            self.service_tier, priority=self.priority, flex=self.flex
        )
        return (
            (
                (prompt_tokens - cached_tokens) * self.prompt
                + cached_tokens * self.cached
                + completion_tokens * self.completion
            )
            * multiplier
            / Decimal(1_000_000)
        )


@dataclass(slots=True, frozen=True)
class BudgetHold:
    """What admission reserved for one response, and the price it is billed at.

    ``account`` is None when nothing is held (no budget; or Redis was down
    and the tenant serves anyway). ``rates`` is None when no price was
    looked up (no budget) or none was in force.
    """

    hold_id: str
    # None while PostgreSQL is down (the snapshot's tiers have no ids).
    tier_id: int | None
    account: str | None = None
    amount: int = 0
    rates: Rates | None = None

    @property
    def price_id(self) -> int | None:
        return self.rates.price_id if self.rates is not None else None


def _exhausted(budget: Decimal, state: ledger.LedgerState) -> BudgetExhausted:
    currency = settings.BILLING_CURRENCY
    spent, held = Decimal(state.spent) * NANO, Decimal(state.held) * NANO
    in_flight = f", {held:.2f} {currency} held by requests in progress" if state.held else ""
    return BudgetExhausted(
        f"Your organization's monthly budget of {budget:.2f} {currency} is exhausted "
        f"({spent:.2f} {currency} spent this month{in_flight}). "
        "Raise the budget or wait for next month."
    )


def _reserve_sync(
    *,
    tenant: Tenant,
    tier_id: int | None,
    model: str,
    hold_id: str,
    prompt_tokens: int,
    completion_tokens: int,
    use_database: bool,
    service_tier: str = "default",
    price_multiplier: Decimal = Decimal(1),
) -> BudgetHold:
    today = timezone.now().astimezone(UTC).date()
    if use_database:
        tenant = Tenant.objects.only("monthly_budget", "budget_when_redis_down", "cache_salt").get(
            pk=tenant.pk
        )
    # Otherwise the auth cache's stand-in knows the budget and the choice.
    budget = tenant.monthly_budget
    if budget is None:
        return BudgetHold(hold_id, tier_id)
    account = account_name(tenant_id=tenant.pk, salt=tenant.cache_salt, day=today)
    book = ledger.get_ledger()
    try:
        if use_database:
            price = price_in_force(tier_id=tier_id, model=model, day=today)
            rates = Rates.of(price, service_tier=service_tier) if price is not None else None
        else:
            encoded = book.recall_price(account=account, model=model)
            if encoded is None:
                return _unavailable(tenant, hold_id, tier_id, "no price known without the database")
            rates = Rates.decode(encoded, service_tier=service_tier)
        # What the response is billed at (batch lines: the discount); the
        # ledger remembers the undiscounted price for interactive requests.
        held = rates.scaled(price_multiplier) if rates is not None else None
        worst = Decimal(0)
        if held is not None:
            worst = held.cost(
                prompt_tokens=prompt_tokens, cached_tokens=0, completion_tokens=completion_tokens
            )
        amount = _to_nano(worst, ROUND_CEILING)
        reserve = dict(account=account, hold_id=hold_id, amount=amount, budget=_to_nano(budget))
        remembered = (model, rates.encode()) if use_database and rates is not None else None
        state = book.reserve(**reserve, price=remembered)
        if state.outcome == ledger.NEEDS_SEED:
            if not use_database:
                return _unavailable(tenant, hold_id, tier_id, "no spend known without the database")
            seed = _to_nano(month_spend(tenant=tenant, period=month_start(today)))
            state = book.reserve(**reserve, seed=seed)
    except RedisError:
        return _unavailable(tenant, hold_id, tier_id, "the budget ledger is unreachable")
    if state.outcome == ledger.EXHAUSTED:
        raise _exhausted(budget, state)
    return BudgetHold(hold_id, tier_id, account, amount, held)


def _unavailable(tenant: Tenant, hold_id: str, tier_id: int | None, why: str) -> BudgetHold:
    if tenant.budget_when_redis_down == Tenant.BudgetWhenRedisDown.ALLOW:
        logger.warning("budget of tenant %s not checked (%s): serving anyway", tenant.pk, why)
        return BudgetHold(hold_id, tier_id)
    logger.warning("budget of tenant %s not checked (%s): refusing", tenant.pk, why)
    raise BudgetUnavailable(why)


async def budget_reserve(
    *,
    tenant: Tenant,
    tier_id: int | None,
    model: str,
    hold_id: str,
    prompt_tokens: int,
    completion_tokens: int,
    use_database: bool = True,
    service_tier: str = "default",
    price_multiplier: Decimal = Decimal(1),
) -> BudgetHold:
    """Hold the request's worst-case cost against the tenant's monthly budget.

    ``completion_tokens`` is the most the request may generate (n x
    max_tokens). Raises ``BudgetExhausted`` (429 ``insufficient_quota``)
    when settled spend, holds in flight and this worst case together pass
    the budget, and ``BudgetUnavailable`` (503) when the ledger cannot be
    reached and the tenant's ``budget_when_redis_down`` is "refuse".
    Without a budget nothing is held and nothing is read but the tenant's
    row. ``use_database=False`` (PostgreSQL down): the budget comes from
    ``tenant`` (the auth cache's stand-in) and the price from the ledger's
    memory of the last admission; without those, as if Redis were down.
    ``price_multiplier``: the fraction of the price the response is billed
    at (Batch API lines: the batch discount).
    """
    return await sync_to_async(_reserve_sync)(
        tenant=tenant,
        tier_id=tier_id,
        model=model,
        hold_id=hold_id,
        prompt_tokens=prompt_tokens,
        completion_tokens=completion_tokens,
        use_database=use_database,
        service_tier=service_tier,
        price_multiplier=price_multiplier,
    )


def _settle_sync(hold: BudgetHold, cost: Decimal) -> bool:
    try:
        return ledger.get_ledger().settle(
            account=hold.account, hold_id=hold.hold_id, cost=_to_nano(cost)
        )
    except RedisError:
        # The hold expires with its lease; budget_check adds the cost from
        # the usage record.
        logger.warning("budget hold %s not settled: ledger unreachable", hold.hold_id)
        return False


async def budget_settle(
    *,
    hold: BudgetHold,
    status: str,
    prompt_tokens: int,
    cached_tokens: int,
    completion_tokens: int,
) -> bool:
    """Turn the hold into spend at what the response is billed (idempotent).

    Failed responses are not billed: their hold is released. The cost is at
    the hold's price, the one the usage record carries. False when nothing
    was held or the hold was settled (or expired) before.
    """
    return await sync_to_async(budget_settle_sync, thread_sensitive=False)(
        hold=hold,
        status=status,
        prompt_tokens=prompt_tokens,
        cached_tokens=cached_tokens,
        completion_tokens=completion_tokens,
    )


def budget_settle_sync(
    *,
    hold: BudgetHold,
    status: str,
    prompt_tokens: int,
    cached_tokens: int,
    completion_tokens: int,
) -> bool:
    """``budget_settle`` for synchronous callers (the usage settler)."""
    if hold.account is None:
        return False
    cost = Decimal(0)
    if status in BILLABLE_STATUSES and hold.rates is not None:
        cost = hold.rates.cost(
            prompt_tokens=prompt_tokens,
            cached_tokens=cached_tokens,
            completion_tokens=completion_tokens,
        )
    return _settle_sync(hold, cost)


async def budget_release(*, hold: BudgetHold) -> bool:
    """Give the whole hold back: the request never reached a worker."""
    if hold.account is None:
        return False
    return await sync_to_async(_settle_sync, thread_sensitive=False)(hold, Decimal(0))


async def budget_renew(*, hold: BudgetHold) -> bool:
    """Extend the hold's lease while its response lives; False when it is gone."""
    if hold.account is None:
        return True
    renew = sync_to_async(ledger.get_ledger().renew, thread_sensitive=False)
    return await renew(account=hold.account, hold_id=hold.hold_id)


def spend_this_month(*, tenant_id: int) -> Decimal:
    """The tenant's settled spend this month from the ledger (seeded when missing)."""
    tenant = Tenant.objects.only("cache_salt").get(pk=tenant_id)
    period = month_start(timezone.now().astimezone(UTC).date())
    account = account_name(tenant_id=tenant.pk, salt=tenant.cache_salt, day=period)
    book = ledger.get_ledger()
    nano = book.spent(account=account)
    if nano is None:
        book.catch_up(account=account, spent=_to_nano(month_spend(tenant=tenant, period=period)))
        nano = book.spent(account=account)
    return Decimal(nano) * NANO


def spend_catch_up(*, tenant: Tenant, period: date, spend: Decimal) -> bool:
    """Raise the ledger's spend for ``period`` to ``spend`` (the records') if below."""
    account = account_name(tenant_id=tenant.pk, salt=tenant.cache_salt, day=period)
    return ledger.get_ledger().catch_up(account=account, spent=_to_nano(spend))
