"""Writes for tenants, memberships and API keys."""

import secrets
import string
from datetime import timedelta
from decimal import Decimal

from django.contrib.auth.base_user import AbstractBaseUser
from django.core.exceptions import ValidationError
from django.db import IntegrityError, transaction
from django.db.models import Q
from django.utils import timezone
from django.utils.text import slugify

from tenants.models import ApiKey, Membership, Tenant, Tier, hash_api_key
from tenants.selectors import tier_get

# The current default tiers. The data migration 0002 seeds a frozen copy of
# these; tier_seed_defaults() restores them where a test flushed the tables.
DEFAULT_TIERS: tuple[dict, ...] = (
    {
        "name": "free",
        "display_name": "Free",
        "rpm": 20,
        "tpm": 20_000,
        "monthly_token_quota": 1_000_000,
        "max_context_tokens": 2048,
        "max_output_tokens": 512,
        "max_concurrent_requests": 2,
        "scheduling_weight": Decimal("0.15"),
        "priority": 0,
        "queue_sla_seconds": 30,
        "api_access": False,
    },
    {
        "name": "pro",
        "display_name": "Pro",
        "rpm": 600,
        "tpm": 200_000,
        "monthly_token_quota": 50_000_000,
        "max_context_tokens": 8192,
        "max_output_tokens": 2048,
        "max_concurrent_requests": 16,
        "scheduling_weight": Decimal("0.35"),
        "priority": 1,
        "queue_sla_seconds": 10,
        "api_access": True,
    },
    {
        "name": "enterprise",
        "display_name": "Enterprise",
        "rpm": 3000,
        "tpm": 1_000_000,
        "monthly_token_quota": 1_000_000_000,
        "max_context_tokens": 8192,
        "max_output_tokens": 4096,
        "max_concurrent_requests": 64,
        "scheduling_weight": Decimal("0.50"),
        "priority": 2,
        "queue_sla_seconds": 5,
        "api_access": True,
    },
)

# last_used_at is informational; writing it on every request would put a row
# lock on the hot path, so it is refreshed at most this often per key.
API_KEY_TOUCH_INTERVAL = timedelta(seconds=60)

_PREFIX_ALPHABET = string.ascii_lowercase + string.digits
_PREFIX_RANDOM_CHARS = 8


@transaction.atomic
def tier_seed_defaults() -> list[Tier]:
    """Create any missing default tier; existing rows keep their values."""
    return [
        Tier.objects.get_or_create(name=spec["name"], defaults=spec)[0] for spec in DEFAULT_TIERS
    ]


def _unique_slug(name: str) -> str:
    base = slugify(name)[:100] or "tenant"
    slug = base
    while Tenant.objects.filter(slug=slug).exists():
        slug = f"{base}-{secrets.token_hex(3)}"
    return slug


@transaction.atomic
def tenant_create(*, name: str, tier_name: str) -> Tenant:
    tenant = Tenant(name=name, slug=_unique_slug(name), tier=tier_get(name=tier_name))
    tenant.full_clean()
    tenant.save()
    return tenant


def tenant_get_or_create(*, name: str, tier_name: str) -> tuple[Tenant, bool]:
    """Return the tenant called ``name``, creating it on ``tier_name`` if new.

    An existing tenant keeps its tier; callers that care compare it.
    """
    existing = Tenant.objects.select_related("tier").filter(name=name).first()
    if existing is not None:
        return existing, False
    try:
        return tenant_create(name=name, tier_name=tier_name), True
    except (IntegrityError, ValidationError):
        # Another process may have created it between the lookup and the
        # insert (caught by full_clean or by the unique index).
        existing = Tenant.objects.select_related("tier").filter(name=name).first()
        if existing is None:
            raise
        return existing, False


@transaction.atomic
def tenant_set_tier(*, tenant: Tenant, tier_name: str) -> Tenant:
    tier = tier_get(name=tier_name)
    tenant.tier = tier
    tenant.save(update_fields=["tier"])
    # Per-key overrides must stay within the tier (ApiKey.clean); lower them
    # rather than leave rows that the admin would refuse to save.
    keys = ApiKey.objects.filter(tenant=tenant)
    keys.filter(rpm_limit__gt=tier.rpm).update(rpm_limit=tier.rpm)
    keys.filter(tpm_limit__gt=tier.tpm).update(tpm_limit=tier.tpm)
    return tenant


@transaction.atomic
def membership_create(
    *, user: AbstractBaseUser, tenant: Tenant, role: str = Membership.Role.MEMBER
) -> Membership:
    membership = Membership(user=user, tenant=tenant, role=role)
    membership.full_clean()
    membership.save()
    return membership


def _new_prefix() -> str:
    body = "".join(secrets.choice(_PREFIX_ALPHABET) for _ in range(_PREFIX_RANDOM_CHARS))
    return f"{ApiKey.PREFIX_TAG}{body}"


@transaction.atomic
def api_key_create(
    *,
    tenant: Tenant,
    name: str,
    created_by: AbstractBaseUser | None = None,
    rpm_limit: int | None = None,
    tpm_limit: int | None = None,
) -> tuple[ApiKey, str]:
    """Create a key and return it with the raw key, which is never stored.

    The raw key is ``f"{prefix}.{secret}"``; only its SHA-256 is kept.
    """
    prefix = _new_prefix()
    # 36**8 prefixes make a collision rare, not impossible.
    while ApiKey.objects.filter(prefix=prefix).exists():
        prefix = _new_prefix()
    raw_key = f"{prefix}.{secrets.token_urlsafe(32)}"
    api_key = ApiKey(
        tenant=tenant,
        name=name,
        prefix=prefix,
        secret_hash=hash_api_key(raw_key),
        created_by=created_by,
        rpm_limit=rpm_limit,
        tpm_limit=tpm_limit,
    )
    api_key.full_clean()
    api_key.save()
    return api_key, raw_key


def api_key_revoke(*, api_key: ApiKey) -> ApiKey:
    """Revoke the key; revoking twice keeps the first revocation time."""
    now = timezone.now()
    ApiKey.objects.filter(pk=api_key.pk, revoked_at__isnull=True).update(revoked_at=now)
    api_key.refresh_from_db(fields=["revoked_at"])
    return api_key


def api_key_touch(*, api_key: ApiKey) -> bool:
    """Record that the key was used; returns True when a row was written.

    One conditional UPDATE: concurrent requests on the same key write at most
    once per API_KEY_TOUCH_INTERVAL and never read-modify-write.
    """
    now = timezone.now()
    cutoff = now - API_KEY_TOUCH_INTERVAL
    written = (
        ApiKey.objects.filter(pk=api_key.pk)
        .filter(Q(last_used_at__isnull=True) | Q(last_used_at__lt=cutoff))
        .update(last_used_at=now)
    )
    if written:
        api_key.last_used_at = now
    return bool(written)
