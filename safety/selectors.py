"""Reads: the effective policy of a tenant, the tier bounds, recorded events."""

from __future__ import annotations

import logging
import threading
import time

from django.conf import settings
from django.db import DatabaseError

from fleet.fallback import DB_UNREACHABLE, db_mark_down, db_marked_down
from safety.models import SafetyEvent, TenantSafetyPolicy, TierSafetyPolicy
from safety.policy import Policy, TierBounds, default_bounds, policy_resolve
from tenants.models import Tenant, Tier

logger = logging.getLogger(__name__)

# tenant id -> (expires at, policy): two queries saved on every request.
_cache: dict[int, tuple[float, Policy]] = {}
_cache_lock = threading.Lock()


def tier_bounds(*, tier: Tier) -> TierBounds:
    row = TierSafetyPolicy.objects.filter(tier=tier).first()
    return row.bounds() if row is not None else default_bounds(tier.name)


def tenant_policy_get(*, tenant: Tenant) -> TenantSafetyPolicy | None:
    return TenantSafetyPolicy.objects.filter(tenant=tenant).first()


def policy_for_tenant(*, tenant: Tenant) -> Policy:
    """The tenant's effective policy, cached for SAFETY_POLICY_CACHE_SECONDS.

    With PostgreSQL down the tier's built-in defaults apply: moderation
    never switches off because the database is unreachable.
    """
    now = time.monotonic()
    cached = _cache.get(tenant.pk)
    if cached is not None and cached[0] > now:
        return cached[1]
    if db_marked_down():
        return policy_resolve(default_bounds(tenant.tier.name))
    try:
        row = tenant_policy_get(tenant=tenant)
        policy = policy_resolve(tier_bounds(tier=tenant.tier), row.choices() if row else None)
    except DatabaseError as exc:
        # Moderation never switches off: the tier's defaults, uncached. Only
        # an unreachable database trips the breaker for everyone.
        if isinstance(exc, DB_UNREACHABLE):
            db_mark_down()
        else:
            logger.error("Policy lookup of tenant %s failed", tenant.pk, exc_info=True)
        return policy_resolve(default_bounds(tenant.tier.name))
    with _cache_lock:
        _cache[tenant.pk] = (now + settings.SAFETY_POLICY_CACHE_SECONDS, policy)
    return policy


def policy_cache_forget(*, tenant_id: int | None = None) -> None:
    """Drop a tenant's cached policy (all of them with None), after a change."""
    with _cache_lock:
        if tenant_id is None:
            _cache.clear()
        else:
            _cache.pop(tenant_id, None)


def safety_event_list(*, tenant: Tenant, limit: int = 100):
    return SafetyEvent.objects.filter(tenant=tenant).select_related("api_key", "user")[:limit]
