"""Writes for tenants, memberships and API keys."""

import secrets
import string
from datetime import datetime, timedelta
from decimal import Decimal

from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.base_user import AbstractBaseUser
from django.contrib.auth.password_validation import validate_password
from django.core.exceptions import ValidationError
from django.db import IntegrityError, transaction
from django.db.models import Q
from django.utils import timezone
from django.utils.text import slugify

from tenants.models import ApiKey, Invitation, Membership, Tenant, Tier, hash_api_key
from tenants.selectors import tier_get
from tenants.signals import api_key_revoked

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
        "priority_service_tier": True,
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
    # rather than leave rows that the admin would refuse to save. One save
    # per key, so the audit log shows each lowered limit.
    over = Q(rpm_limit__gt=tier.rpm) | Q(tpm_limit__gt=tier.tpm)
    for key in ApiKey.objects.filter(over, tenant=tenant):
        key.rpm_limit = min(key.rpm_limit, tier.rpm) if key.rpm_limit else key.rpm_limit
        key.tpm_limit = min(key.tpm_limit, tier.tpm) if key.tpm_limit else key.tpm_limit
        key.save(update_fields=["rpm_limit", "tpm_limit"])
    return tenant


def tenant_set_shadow_opt_in(*, tenant: Tenant, enabled: bool) -> Tenant:
    """The tenant's consent to shadow comparisons (fleet.shadow); withdrawing
    it also has its stored comparisons purged (fleet.tasks.shadow_purge)."""
    tenant.shadow_opt_in = enabled
    tenant.full_clean()
    tenant.save(update_fields=["shadow_opt_in"])
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
    owner: AbstractBaseUser | None = None,
    rpm_limit: int | None = None,
    tpm_limit: int | None = None,
    expires_at: datetime | None = None,
    allowed_models: list[str] | None = None,
) -> tuple[ApiKey, str]:
    """Create a key and return it with the raw key, which is never stored.

    The raw key is ``f"{prefix}.{secret}"``; only its SHA-256 is kept.
    ``owner`` must be a member of ``tenant`` (ValidationError otherwise).
    """
    if owner is not None and not Membership.objects.filter(user=owner, tenant=tenant).exists():
        raise ValidationError({"owner": "The key's owner must be a member of the tenant."})
    if expires_at is not None and expires_at <= timezone.now():
        raise ValidationError({"expires_at": "The expiry must be in the future."})
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
        owner=owner,
        rpm_limit=rpm_limit,
        tpm_limit=tpm_limit,
        expires_at=expires_at,
        allowed_models=sorted(set(allowed_models or [])),
    )
    api_key.full_clean()
    api_key.save()
    return api_key, raw_key


@transaction.atomic
def api_key_revoke(*, api_key: ApiKey) -> ApiKey:
    """Revoke the key; revoking twice keeps the first revocation time.

    A locked read and a save, not a bare UPDATE: the save is what the audit
    log records.
    """
    locked = ApiKey.objects.select_for_update().get(pk=api_key.pk)
    if locked.revoked_at is None:
        locked.revoked_at = timezone.now()
        locked.save(update_fields=["revoked_at"])
    api_key.revoked_at = locked.revoked_at
    # After the commit: a purge before it could be refilled by a request
    # that still read the key as valid.
    transaction.on_commit(lambda: api_key_revoked.send(sender=ApiKey, api_key=locked))
    return api_key


def api_key_touch_due(*, api_key: ApiKey) -> bool:
    """Whether ``api_key_touch`` could write: False while the key's
    ``last_used_at`` as loaded is within API_KEY_TOUCH_INTERVAL (the row's
    value only grows, so its conditional UPDATE would match nothing). The
    request path, which has just loaded the key, skips the query then, and
    the thread hop to it."""
    last = api_key.last_used_at
    return last is None or last < timezone.now() - API_KEY_TOUCH_INTERVAL


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


# -- invitations -------------------------------------------------------------------


@transaction.atomic
def invitation_create(
    *,
    tenant: Tenant,
    email: str,
    role: str = Membership.Role.MEMBER,
    invited_by: AbstractBaseUser | None = None,
) -> tuple[Invitation, str]:
    """A new invitation and its raw token (only its hash is stored).

    Says nothing about whether an account with that email exists: joining
    always creates a new account, so there is nothing to look up. Refuses
    (ValidationError on ``email``) an address the tenant has already
    invited and whose invitation is still pending: a second live link to
    the same seat helps nobody; withdraw the first to send another.
    """
    email = email.strip()
    # Serializes two admins inviting the same address at the same moment.
    Tenant.objects.select_for_update().filter(pk=tenant.pk).exists()
    pending = Invitation.objects.filter(
        tenant=tenant,
        email__iexact=email,
        accepted_at=None,
        revoked_at=None,
        expires_at__gt=timezone.now(),
    )
    if pending.exists():
        raise ValidationError(
            {"email": f"{email} already has a pending invitation. Withdraw it to send a new one."}
        )
    token = secrets.token_urlsafe(32)
    invitation = Invitation(
        tenant=tenant,
        email=email,
        role=role,
        token_hash=hash_api_key(token),
        invited_by=invited_by,
        expires_at=timezone.now() + settings.INVITATION_TTL,
    )
    invitation.full_clean()
    invitation.save()
    return invitation, token


@transaction.atomic
def invitation_accept(*, token: str, username: str, password: str) -> Membership:
    """Create the invitee's new account and membership; the token is spent.

    Raises Invitation.DoesNotExist for an unknown, used, revoked or expired
    token (one answer for all of them) and ValidationError for a taken
    username or a password the validators refuse.
    """
    invitation = (
        Invitation.objects.select_for_update()
        .select_related("tenant")
        .get(token_hash=hash_api_key(token))
    )
    if not invitation.is_pending:
        raise Invitation.DoesNotExist
    User = get_user_model()
    user = User(username=username.strip(), email=invitation.email)
    user.full_clean(exclude=["password"])
    validate_password(password, user=user)
    user.set_password(password)
    user.save()
    invitation.accepted_at = timezone.now()
    invitation.accepted_by = user
    invitation.save(update_fields=["accepted_at", "accepted_by"])
    return membership_create(user=user, tenant=invitation.tenant, role=invitation.role)


@transaction.atomic
def invitation_revoke(*, tenant: Tenant, invitation_id: int) -> Invitation:
    """Withdraw a pending invitation; raises Invitation.DoesNotExist for another tenant's."""
    invitation = Invitation.objects.select_for_update().get(tenant=tenant, pk=invitation_id)
    if invitation.revoked_at is None and invitation.accepted_at is None:
        invitation.revoked_at = timezone.now()
        invitation.save(update_fields=["revoked_at"])
    return invitation
