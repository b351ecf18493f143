"""Rate limits and quotas per API key and per tenant.

``rate_limit_count`` runs first, before any work on a request (screening,
tokenizing): it counts the request in the requests-per-minute windows, so
work done before admission is paid for even when the request is refused.
``rate_limit_admit`` runs before any GPU work: requests and tokens per
sliding minute (key and tenant), the tenant's concurrent-request cap and
its tier's monthly token quota, in one atomic check. A Batch API line's
ticket (``Ticket.batch``) has windows and slots of its own and no RPM, TPM
or concurrency limit (``batch_limits``): batches are bounded by their
in-flight caps and the tier's batch queue tokens, as OpenAI's count against
a batch queue limit and not the interactive rate limits. They still take
the monthly quota, which is the tenant's, whichever lane spends it. ``rate_limit_renew``
extends the response's slot lease while it lives (the relay calls it every
third of a lease). ``rate_limit_settle`` runs once per response at its end,
whatever the ending, and corrects the reservation to the real usage. With
REDIS_URL the state is shared by every web process (RedisLimiter); without
it, embedded mode keeps it in this process (MemoryLimiter).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

from asgiref.sync import sync_to_async
from django.conf import settings

from tenants.ratelimit.base import (
    ADMITTED,
    CONCURRENCY,
    NEEDS_SEED,
    QUOTA,
    REQUESTS,
    TOKENS,
    Decision,
    Limiter,
    Limits,
    Ticket,
    batch_limits,
    decision_from,
    format_reset,
)
from tenants.ratelimit.memory_limiter import MemoryLimiter
from tenants.ratelimit.redis_limiter import RedisLimiter

if TYPE_CHECKING:
    from tenants.models import ApiKey, Tenant

__all__ = [
    "ADMITTED",
    "CONCURRENCY",
    "QUOTA",
    "REQUESTS",
    "TOKENS",
    "Decision",
    "Limits",
    "Ticket",
    "batch_limits",
    "format_reset",
    "get_limiter",
    "limits_for",
    "limits_for_tenant",
    "lease_seconds",
    "rate_limit_admit",
    "rate_limit_count",
    "rate_limit_renew",
    "rate_limit_settle",
    "reset_limiters",
]

_limiters: dict[tuple, Limiter] = {}
_lock = threading.Lock()


def lease_seconds() -> float:
    """How long a slot outlives its owner's last renewal (RATE_LIMIT_SLOT_TTL)."""
    return float(getattr(settings, "RATE_LIMIT_SLOT_TTL", 30))


def get_limiter() -> Limiter:
    """The limiter for the current settings (one per Redis URL and prefix)."""
    url = settings.REDIS_URL
    prefix = getattr(settings, "RATE_LIMIT_PREFIX", "rl")
    lease_ms = int(lease_seconds() * 1000)
    cache_key = (url, prefix, lease_ms)
    with _lock:
        limiter = _limiters.get(cache_key)
        if limiter is None:
            limiter = (
                RedisLimiter(url, prefix=prefix, lease_ms=lease_ms)
                if url
                else MemoryLimiter(lease_ms=lease_ms)
            )
            _limiters[cache_key] = limiter
        return limiter


def reset_limiters() -> None:
    """Forget every limiter and its in-process state (tests)."""
    with _lock:
        _limiters.clear()


def limits_for(api_key: ApiKey) -> Limits:
    """The key's limits; ``api_key.tenant.tier`` must be loaded already."""
    tier = api_key.tenant.tier
    return Limits(
        key_rpm=api_key.effective_rpm,
        key_tpm=api_key.effective_tpm,
        tenant_rpm=tier.rpm,
        tenant_tpm=tier.tpm,
        max_concurrent=tier.max_concurrent_requests,
        monthly_quota=tier.monthly_token_quota,
    )


def limits_for_tenant(tenant: Tenant) -> Limits:
    """Limits of a request made without a key (the console): the tier's alone."""
    tier = tenant.tier
    return Limits(
        key_rpm=tier.rpm,
        key_tpm=tier.tpm,
        tenant_rpm=tier.rpm,
        tenant_tpm=tier.tpm,
        max_concurrent=tier.max_concurrent_requests,
        monthly_quota=tier.monthly_token_quota,
    )


async def rate_limit_admit(
    *, ticket: Ticket, limits: Limits, tokens: int, quota_used: Callable[..., int]
) -> Decision:
    """Check and take one request reserving ``tokens``; see ``Decision.admitted``.

    The month's counter is seeded the first time a tenant calls in a month
    (or after Redis lost it) from ``quota_used(tenant_id=..., period="YYYYMM")``,
    the tokens its usage records hold for that month (billing knows them;
    the caller passes the lookup in): one extra round trip.
    """
    limits = batch_limits(limits) if ticket.batch else limits
    limiter = get_limiter()
    admit = sync_to_async(limiter.admit, thread_sensitive=False)
    snapshot = await admit(ticket=ticket, limits=limits, tokens=tokens)
    if snapshot.outcome == NEEDS_SEED:
        seed = await sync_to_async(quota_used)(tenant_id=ticket.tenant_id, period=ticket.period)
        snapshot = await admit(ticket=ticket, limits=limits, tokens=tokens, quota_seed=seed)
    return decision_from(snapshot, limits)


async def rate_limit_count(*, ticket: Ticket, limits: Limits) -> Decision:
    """Count the request in its key's and tenant's request windows, no tokens.

    Refused (outcome ``requests``) when either window is full. A later
    ``rate_limit_admit`` of the same ticket adds the tokens and checks the
    other limits without counting the request again.
    """
    limits = batch_limits(limits) if ticket.batch else limits
    limiter = get_limiter()
    count = sync_to_async(limiter.count, thread_sensitive=False)
    return decision_from(await count(ticket=ticket, limits=limits), limits)


async def rate_limit_renew(*, ticket: Ticket) -> bool:
    """Extend the response's slot lease; False when it already ran out."""
    limiter = get_limiter()
    return await sync_to_async(limiter.renew, thread_sensitive=False)(ticket=ticket)


async def rate_limit_settle(*, ticket: Ticket, tokens: int, quota_tokens: int) -> bool:
    """Release the slot and settle the reservation (idempotent per response)."""
    limiter = get_limiter()
    return await sync_to_async(limiter.settle, thread_sensitive=False)(
        ticket=ticket, tokens=tokens, quota_tokens=quota_tokens
    )
