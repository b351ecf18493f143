"""A response's claims on its tenant's limits: taken at admission, kept alive
while it runs, settled at its end.

Before any of that, ``limits_count`` counts the request in the key's and
tenant's requests-per-minute windows, once its model is known and before
any work on it, so the work before admission (screening, tokenizing,
grammar compiles, safety-event writes) is limited and paid for with a
request even when the request is refused afterwards. Moderations and stream resumes, which never
reach admission, are counted the same way.

A Batch API line's ticket (``Ticket.batch``) takes the same steps in the
batch lane: windows and slots of its own with no RPM, TPM or concurrency
limit (``tenants.ratelimit.batch_limits``), the same budget hold, monthly
quota and usage record.

Admission takes two claims, in this order: the budget hold (billing's
ledger: the request's worst-case cost) and the rate-limit reservation
(tenants.ratelimit: a concurrency slot, tokens in the sliding windows and
in the monthly quota). Both are leases: ``limits_renew`` extends them while
the response lives (the relay calls it every third of a lease), so a long
stream keeps them and a dead web process loses them within one lease. A
request refused or never dispatched gives both back at once; a response
that ran settles both at its end (``limits_settle``, after its usage record).
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from decimal import Decimal

from redis.exceptions import RedisError

from billing.selectors import usage_month_tokens
from billing.services import (
    BudgetExhausted,
    BudgetHold,
    BudgetUnavailable,
    budget_release,
    budget_renew,
    budget_reserve,
    claims_settle,
)
from fleet.fallback import DB_UNREACHABLE, db_mark_down, db_marked_down
from inference import metrics
from inference.errors import InsufficientQuota, ServiceUnavailable, rate_limit_error
from inference.offload import offloaded
from tenants.models import ApiKey, Tenant
from tenants.ratelimit import (
    Decision,
    Ticket,
    lease_seconds,
    limits_for,
    limits_for_tenant,
    rate_limit_admit,
    rate_limit_count,
    rate_limit_renew,
    rate_limit_settle,
)
from wire.usage import UsageEntry

logger = logging.getLogger(__name__)


@dataclass(slots=True, frozen=True)
class Admission:
    """What an admitted request holds: its rate-limit ticket and budget hold."""

    ticket: Ticket
    decision: Decision
    hold: BudgetHold


async def _budget_hold(
    tenant: Tenant,
    ticket: Ticket,
    model: str,
    prompt_tokens: int,
    completion_tokens: int,
    service_tier: str,
    price_multiplier: Decimal = Decimal(1),
) -> BudgetHold:
    kwargs = dict(
        tenant=tenant,
        tier_id=tenant.tier.pk,
        model=model,
        hold_id=ticket.response_id,
        prompt_tokens=prompt_tokens,
        completion_tokens=completion_tokens,
        service_tier=service_tier,
        price_multiplier=price_multiplier,
    )
    if not db_marked_down():
        try:
            return await budget_reserve(**kwargs)
        except DB_UNREACHABLE:
            db_mark_down()
    # PostgreSQL is down: the budget from the tenant at hand (the auth
    # cache's), the spend and the price from the ledger.
    return await budget_reserve(**kwargs, use_database=False)


async def limits_count(
    *, tenant: Tenant, api_key: ApiKey | None, ticket: Ticket, model: str = ""
) -> Decision:
    """Count one request against the key's and tenant's request rates.

    Raises RateLimited (429, with Retry-After and the x-ratelimit-*
    headers) when a window is full, ServiceUnavailable when Redis is down.
    ``limits_admit`` with the same ticket does not count it again.
    ``model`` labels the refusal's metric ("" for calls of no model).
    """
    limits = limits_for(api_key) if api_key is not None else limits_for_tenant(tenant)
    try:
        decision = await rate_limit_count(ticket=ticket, limits=limits)
    except RedisError as exc:
        raise ServiceUnavailable(code="bus_unavailable") from exc
    if not decision.admitted:
        metrics.request_refused(reason=decision.outcome, tier=tenant.tier.name, model=model)
        raise rate_limit_error(decision, tokens=0)
    return decision


async def limits_admit(
    *,
    tenant: Tenant,
    api_key: ApiKey | None,
    ticket: Ticket,
    model: str,
    prompt_tokens: int,
    completion_tokens: int,
    service_tier: str = "default",
    price_multiplier: Decimal = Decimal(1),
) -> Admission:
    """Take the budget hold and the rate-limit reservation, or neither.

    ``completion_tokens`` is the most the request may generate (n x
    max_tokens); ``price_multiplier`` the fraction of the price it is
    billed at (Batch API lines: the batch discount), which the hold takes. Raises InsufficientQuota (budget or monthly quota),
    RateLimited (with Retry-After) and ServiceUnavailable (Redis down; or
    the budget unverifiable for a tenant that refuses then).
    """
    tier = tenant.tier
    try:
        hold = await _budget_hold(
            tenant, ticket, model, prompt_tokens, completion_tokens, service_tier, price_multiplier
        )
    except BudgetExhausted as exc:
        metrics.request_refused(reason=metrics.BUDGET, tier=tier.name, model=model)
        raise InsufficientQuota(exc.message) from exc
    except BudgetUnavailable as exc:
        raise ServiceUnavailable(
            "Your organization's budget cannot be checked right now; retry shortly.",
            code="budget_unavailable",
            headers={"Retry-After": "5"},
        ) from exc
    reserved = prompt_tokens + completion_tokens
    limits = limits_for(api_key) if api_key is not None else limits_for_tenant(tenant)
    try:
        decision = await rate_limit_admit(
            ticket=ticket, limits=limits, tokens=reserved, quota_used=usage_month_tokens
        )
    except RedisError as exc:
        await _release_quietly(budget_release(hold=hold), ticket)
        # The bus lives in the same Redis: nothing could be served anyway.
        raise ServiceUnavailable(code="bus_unavailable") from exc
    except BaseException:
        await _release_quietly(budget_release(hold=hold), ticket)
        raise
    if not decision.admitted:
        await _release_quietly(budget_release(hold=hold), ticket)
        metrics.request_refused(reason=decision.outcome, tier=tier.name, model=model)
        raise rate_limit_error(decision, tokens=reserved)
    return Admission(ticket, decision, hold)


async def limits_release(admission: Admission) -> None:
    """Give everything back: the request never reached a worker."""
    await _release_quietly(
        rate_limit_settle(ticket=admission.ticket, tokens=0, quota_tokens=0), admission.ticket
    )
    await _release_quietly(budget_release(hold=admission.hold), admission.ticket)


async def limits_settle(admission: Admission, usage: UsageEntry) -> None:
    """Settle both claims to what the response used, after its usage record
    (``billing.services.claims_settle``; the usage settler calls it too, and
    whichever runs second finds nothing left to settle)."""
    await offloaded(claims_settle)(
        hold=admission.hold,
        ticket=admission.ticket,
        status=usage.status,
        prompt_tokens=usage.prompt_tokens,
        cached_tokens=usage.cached_tokens,
        completion_tokens=usage.completion_tokens,
    )


async def limits_renew(admission: Admission) -> None:
    """Extend the slot's and the hold's leases: the response is still running."""
    slot = await rate_limit_renew(ticket=admission.ticket)
    held = await budget_renew(hold=admission.hold)
    if not (slot and held):
        # Renewals came too late (a stalled event loop): the claim was
        # refunded and may be in use by another request.
        logger.warning(
            "lease of %s lost (slot %s, budget hold %s)", admission.ticket.response_id, slot, held
        )


class LeaseKeeper:
    """The response's heartbeat: renews its claims every third of a lease.

    A context manager for the relay's task: beats from entry until ``stop()``
    or exit, whichever comes first.
    """

    def __init__(self, admission: Admission):
        self.admission = admission
        self.every = lease_seconds() / 3
        self._task: asyncio.Task | None = None

    def __enter__(self) -> LeaseKeeper:
        # Referenced here until stopped, so the loop cannot collect it.
        self._task = asyncio.get_running_loop().create_task(self._beat())
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()

    async def _beat(self) -> None:
        while True:
            await asyncio.sleep(self.every)
            try:
                await limits_renew(self.admission)
            except Exception:
                # Retried at the next beat: a lease is three beats long.
                logger.warning(
                    "Renewing the leases of %s failed", self.admission.ticket.response_id
                )


async def _release_quietly(release, ticket: Ticket) -> None:
    try:
        await release
    except Exception:
        # Unreleased claims expire with their lease.
        logger.warning("Could not release the claims of %s", ticket.response_id, exc_info=True)
