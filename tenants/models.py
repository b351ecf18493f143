"""Tenants, tiers, memberships and API keys: who may call, and how much."""

import hashlib
import secrets

from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.validators import MinValueValidator
from django.db import models
from django.utils import timezone


def new_cache_salt() -> str:
    return secrets.token_hex(16)


def hash_api_key(raw_key: str) -> str:
    """SHA-256 hex of the whole raw key, the only form of it that is stored."""
    return hashlib.sha256(raw_key.encode()).hexdigest()


class Tier(models.Model):
    """A service level: rate limits, quotas, context caps and scheduling share.

    The three rows (free, pro, enterprise) are seeded by a data migration;
    staff may tune the numbers in the admin.
    """

    name = models.SlugField(max_length=32, unique=True)
    display_name = models.CharField(max_length=64)
    rpm = models.PositiveIntegerField(help_text="Requests per minute.")
    tpm = models.PositiveIntegerField(help_text="Tokens per minute (prompt + max_tokens).")
    monthly_token_quota = models.PositiveBigIntegerField()
    max_context_tokens = models.PositiveIntegerField()
    max_output_tokens = models.PositiveIntegerField()
    max_concurrent_requests = models.PositiveIntegerField()
    # Weighted fair share of the engine's running slots and token budget.
    scheduling_weight = models.DecimalField(max_digits=3, decimal_places=2)
    # Engine priority: higher wins when preemption picks a victim.
    priority = models.PositiveSmallIntegerField(default=0)
    # Admission control rejects a request whose estimated wait exceeds this.
    queue_sla_seconds = models.PositiveIntegerField()
    # The OpenAI REST API serves paid tiers; the free tier is console-only.
    api_access = models.BooleanField(default=False)
    # Largest file a tenant may upload for the Batch API (/v1/files). Every
    # tier starts at 100 MiB (DEFAULT_TIERS is frozen in migration 0002).
    max_batch_file_bytes = models.PositiveBigIntegerField(
        default=100 * 1024 * 1024,
        help_text="Largest batch input file, in bytes (staff may set it per tier).",
    )
    # The Batch API's own limit, as OpenAI's: tokens (prompts plus all they
    # may generate) of a tenant's batches in progress at once; a batch that
    # would pass it fails validation with token_limit_exceeded.
    batch_queue_tokens = models.PositiveBigIntegerField(
        default=50_000_000,
        help_text="Most enqueued tokens of a tenant's batches in progress at once.",
    )

    class AutoServiceTier(models.TextChoices):
        DEFAULT = "default", "Default"
        PRIORITY = "priority", "Priority"

    # OpenAI's service_tier within the tier (inference.service_tier): a
    # request asking for "priority" on a tier without it is served at
    # "default" and told so in the response, as OpenAI does.
    priority_service_tier = models.BooleanField(
        default=False,
        help_text="Requests may ask for service_tier 'priority': scheduled ahead of the "
        "tier's default class and billed at the price's priority multiplier.",
    )
    auto_service_tier = models.CharField(
        max_length=8,
        choices=AutoServiceTier.choices,
        default=AutoServiceTier.DEFAULT,
        help_text="What service_tier 'auto' (or none) is served at; 'priority' only "
        "where the tier may use priority.",
    )

    class Meta:
        ordering = ["priority", "name"]

    def __str__(self) -> str:
        return self.display_name or self.name


class Tenant(models.Model):
    name = models.CharField(max_length=128, unique=True)
    slug = models.SlugField(max_length=128, unique=True)
    tier = models.ForeignKey(Tier, on_delete=models.PROTECT, related_name="tenants")
    is_active = models.BooleanField(default=True)
    created_at = models.DateTimeField(auto_now_add=True)
    # Mixed into prefix-cache block hashes so tenants never share KV blocks
    # (a cache hit would leak timing about another tenant's prompts).
    cache_salt = models.CharField(max_length=64, default=new_cache_salt, editable=False)

    class BudgetWhenRedisDown(models.TextChoices):
        REFUSE = "refuse", "Refuse requests (the budget holds)"
        ALLOW = "allow", "Serve requests (the budget may be passed)"

    # Monthly spending cap in the billing currency; None means no cap.
    monthly_budget = models.DecimalField(max_digits=12, decimal_places=2, null=True, blank=True)
    # With a budget, admission reserves each request's worst-case cost in
    # Redis; without Redis that cannot be checked, and this decides.
    budget_when_redis_down = models.CharField(
        max_length=8,
        choices=BudgetWhenRedisDown.choices,
        default=BudgetWhenRedisDown.REFUSE,
        help_text="What requests get while the budget's reservations cannot be checked "
        "(Redis unreachable): refused (503), or served without the hard stop.",
    )
    # Shadow comparisons store completions for review: only with consent.
    shadow_opt_in = models.BooleanField(
        default=False,
        help_text="Let rollouts run a share of this tenant's requests on a canary too, "
        "and keep both outputs for SHADOW_RETENTION_DAYS.",
    )

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name

    def get_additional_data(self) -> dict:
        # The audit log's tenant, so tenant admins see their own entries.
        return {"tenant_id": self.pk}


class Membership(models.Model):
    class Role(models.TextChoices):
        ADMIN = "admin", "Admin"
        MEMBER = "member", "Member"

    # A user belongs to exactly one tenant: the console needs no tenant picker.
    user = models.OneToOneField(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="membership"
    )
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="memberships")
    role = models.CharField(max_length=16, choices=Role.choices, default=Role.MEMBER)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["tenant", "user"]

    def __str__(self) -> str:
        return f"{self.user} @ {self.tenant} ({self.role})"

    def get_additional_data(self) -> dict:
        return {"tenant_id": self.tenant_id}


class ApiKey(models.Model):
    """An API key. The raw key is ``f"{prefix}.{secret}"``, shown once.

    Only ``prefix`` (for lookup and display) and a SHA-256 of the whole raw
    key are stored. A slow password hash (PBKDF2, argon2) defends guessable
    human passwords; this secret is 32 random bytes, so brute force is out of
    reach already and a fast hash keeps authentication off the hot path.
    """

    PREFIX_TAG = "sk-lp-"

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="api_keys")
    name = models.CharField(max_length=128)
    prefix = models.CharField(max_length=32, unique=True, db_index=True)
    secret_hash = models.CharField(max_length=64, editable=False)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        related_name="+",
    )
    # The member the key is for: members see only their own keys. None: a
    # tenant-wide key, seen by its admins only.
    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        related_name="api_keys",
    )
    created_at = models.DateTimeField(auto_now_add=True)
    revoked_at = models.DateTimeField(null=True, blank=True)
    last_used_at = models.DateTimeField(null=True, blank=True)
    # None: never expires. Authentication refuses the key from then on.
    expires_at = models.DateTimeField(null=True, blank=True)
    # Served model names the key may call; empty: every model of the tier.
    allowed_models = models.JSONField(default=list, blank=True)
    # Per-key overrides; None means the tier's limit applies.
    rpm_limit = models.PositiveIntegerField(
        null=True, blank=True, validators=[MinValueValidator(1)]
    )
    tpm_limit = models.PositiveIntegerField(
        null=True, blank=True, validators=[MinValueValidator(1)]
    )

    class Meta:
        ordering = ["-created_at"]
        verbose_name = "API key"

    def __str__(self) -> str:
        return f"{self.name} ({self.prefix}…)"

    @property
    def is_revoked(self) -> bool:
        return self.revoked_at is not None

    @property
    def is_expired(self) -> bool:
        return self.expires_at is not None and self.expires_at <= timezone.now()

    def allows_model(self, model: str) -> bool:
        return not self.allowed_models or model in self.allowed_models

    def get_additional_data(self) -> dict:
        return {"tenant_id": self.tenant_id}

    # min() rather than trusting the override: a tenant moved to a lower tier
    # keeps its keys, and an override must never lift a key above its tier.
    @property
    def effective_rpm(self) -> int:
        tier_rpm = self.tenant.tier.rpm
        return tier_rpm if self.rpm_limit is None else min(self.rpm_limit, tier_rpm)

    @property
    def effective_tpm(self) -> int:
        tier_tpm = self.tenant.tier.tpm
        return tier_tpm if self.tpm_limit is None else min(self.tpm_limit, tier_tpm)

    def clean(self) -> None:
        super().clean()
        if self.tenant_id is None:
            return
        tier = self.tenant.tier
        errors = {}
        if self.rpm_limit is not None and self.rpm_limit > tier.rpm:
            errors["rpm_limit"] = f"Must not exceed the {tier.name} tier's rpm ({tier.rpm})."
        if self.tpm_limit is not None and self.tpm_limit > tier.tpm:
            errors["tpm_limit"] = f"Must not exceed the {tier.name} tier's tpm ({tier.tpm})."
        models_given = self.allowed_models
        if not isinstance(models_given, list) or not all(
            isinstance(m, str) and m for m in models_given
        ):
            errors["allowed_models"] = "A list of served model names."
        if errors:
            raise ValidationError(errors)


class Invitation(models.Model):
    """An emailed, expiring, single-use invitation to join a tenant.

    Joining always creates a new account (``invitation_accept``): an
    existing account is never attached to a tenant, so an invitation cannot
    reach another tenant's users or staff. Only the SHA-256 of the token is
    stored; the token itself is in the emailed link.
    """

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="invitations")
    email = models.EmailField()
    role = models.CharField(
        max_length=16, choices=Membership.Role.choices, default=Membership.Role.MEMBER
    )
    token_hash = models.CharField(max_length=64, unique=True, editable=False)
    invited_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)
    expires_at = models.DateTimeField()
    accepted_at = models.DateTimeField(null=True, blank=True)
    accepted_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True, related_name="+"
    )
    revoked_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"invitation of {self.email} to {self.tenant}"

    @property
    def is_pending(self) -> bool:
        return (
            self.accepted_at is None
            and self.revoked_at is None
            and self.expires_at > timezone.now()
        )

    def get_additional_data(self) -> dict:
        return {"tenant_id": self.tenant_id}
