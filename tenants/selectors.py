"""Reads for tenants and API keys.

These are plain synchronous ORM functions. Async callers (the API, the
console consumers) wrap them: ``await sync_to_async(api_key_authenticate)(
raw_key=...)`` from asgiref, so the query runs in a thread with its own
connection instead of blocking the event loop.
"""

import hmac

from django.contrib.auth.base_user import AbstractBaseUser
from django.db.models import Q, QuerySet
from django.utils import timezone

from tenants.models import ApiKey, Invitation, Tenant, Tier, hash_api_key

# Compared against when the prefix is unknown, so an unknown prefix costs
# the same hash and compare as a known one with a wrong secret.
_DUMMY_HASH = hash_api_key("sk-lp-00000000.dummy")


def tier_get(*, name: str) -> Tier:
    """The tier called ``name``; raises Tier.DoesNotExist."""
    return Tier.objects.get(name=name)


def tier_list() -> QuerySet[Tier]:
    return Tier.objects.all()


def tier_scheduling_weights() -> dict[str, float] | None:
    """Each tier's positive ``scheduling_weight``; None when no tier has one."""
    rows = Tier.objects.values_list("name", "scheduling_weight")
    weights = {name: float(weight) for name, weight in rows if weight and weight > 0}
    return weights or None


def tenant_for_user(*, user: AbstractBaseUser) -> Tenant | None:
    """The tenant the user belongs to, or None (anonymous, staff without one)."""
    if not getattr(user, "is_authenticated", False):
        return None
    return (
        Tenant.objects.select_related("tier").filter(memberships__user=user, is_active=True).first()
    )


def api_key_list(
    *, tenant: Tenant, include_revoked: bool = True, owner: AbstractBaseUser | None = None
) -> QuerySet[ApiKey]:
    """The tenant's keys, newest first; only ``owner``'s when given (a member's view)."""
    keys = ApiKey.objects.filter(tenant=tenant).order_by("-created_at")
    if owner is not None:
        keys = keys.filter(owner=owner)
    if not include_revoked:
        keys = keys.filter(revoked_at__isnull=True)
    return keys


def invitation_pending_get(*, token: str) -> Invitation | None:
    """The pending invitation of ``token``; None if unknown, used, revoked or expired."""
    invitation = (
        Invitation.objects.select_related("tenant").filter(token_hash=hash_api_key(token)).first()
    )
    return invitation if invitation is not None and invitation.is_pending else None


def invitation_list_pending(*, tenant: Tenant) -> QuerySet[Invitation]:
    return Invitation.objects.filter(
        tenant=tenant,
        accepted_at__isnull=True,
        revoked_at__isnull=True,
        expires_at__gt=timezone.now(),
    ).select_related("invited_by")


def api_key_authenticate(*, raw_key: str) -> ApiKey | None:
    """The live key matching ``raw_key``, or None.

    None for a malformed key, an unknown prefix, a wrong secret, a revoked
    or expired key or an inactive tenant; callers answer all of them with
    the same 401.
    The returned key has ``tenant`` and ``tenant.tier`` loaded.
    """
    prefix, dot, secret = raw_key.strip().partition(".")
    if not dot or not secret or not prefix.startswith(ApiKey.PREFIX_TAG):
        return None
    api_key = (
        ApiKey.objects.select_related("tenant__tier")
        .filter(prefix=prefix, revoked_at__isnull=True, tenant__is_active=True)
        .filter(Q(expires_at__isnull=True) | Q(expires_at__gt=timezone.now()))
        .first()
    )
    expected = api_key.secret_hash if api_key is not None else _DUMMY_HASH
    # Constant-time compare: the response time must not reveal how many
    # leading characters of the hash matched.
    if not hmac.compare_digest(hash_api_key(raw_key.strip()), expected):
        return None
    return api_key
