"""Safety policies per tier and per tenant, and the events moderation records."""

from __future__ import annotations

from django.conf import settings
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models

from safety.policy import CHECK_ACTIONS, PII_ACTIONS, Action, TenantChoices, TierBounds

CHECK_CHOICES = [(a.value, a.value.capitalize()) for a in CHECK_ACTIONS]
PII_CHOICES = [(a.value, a.value.capitalize()) for a in PII_ACTIONS]
UNIT = [MinValueValidator(0.0), MaxValueValidator(1.0)]


class TierSafetyPolicy(models.Model):
    """A tier's defaults for its tenants and the bounds of their own choices.

    A tier without a row uses ``safety.policy.DEFAULT_BOUNDS``. Edited by
    staff in the admin.
    """

    tier = models.OneToOneField("tenants.Tier", on_delete=models.CASCADE, related_name="+")
    classifier_action = models.CharField(max_length=8, choices=CHECK_CHOICES, default="block")
    classifier_threshold = models.FloatField(default=0.8, validators=UNIT)
    classifier_min_action = models.CharField(
        max_length=8,
        choices=CHECK_CHOICES,
        default="flag",
        help_text="The laxest classifier action a tenant may choose.",
    )
    classifier_max_threshold = models.FloatField(
        default=0.95, validators=UNIT, help_text="The highest (laxest) threshold a tenant may set."
    )
    pii_action = models.CharField(max_length=8, choices=PII_CHOICES, default="redact")
    pii_min_action = models.CharField(
        max_length=8,
        choices=PII_CHOICES,
        default="flag",
        help_text="The laxest PII action a tenant may choose.",
    )
    deny_action = models.CharField(max_length=8, choices=CHECK_CHOICES, default="block")
    max_deny_terms = models.PositiveIntegerField(default=200)
    output_moderation = models.BooleanField(
        default=True, help_text="Check streamed replies (classifier and deny list) by default."
    )
    output_required = models.BooleanField(
        default=False, help_text="Tenants cannot turn the moderation of replies off."
    )
    text_storage_allowed = models.BooleanField(
        default=True, help_text="Tenants may opt in to keeping the text of flagged events."
    )

    class Meta:
        verbose_name_plural = "tier safety policies"

    def __str__(self) -> str:
        return f"Safety policy of {self.tier}"

    def bounds(self) -> TierBounds:
        return TierBounds(
            classifier_action=Action(self.classifier_action),
            classifier_threshold=self.classifier_threshold,
            classifier_min_action=Action(self.classifier_min_action),
            classifier_max_threshold=self.classifier_max_threshold,
            pii_action=Action(self.pii_action),
            pii_min_action=Action(self.pii_min_action),
            deny_action=Action(self.deny_action),
            max_deny_terms=self.max_deny_terms,
            output_moderation=self.output_moderation,
            output_required=self.output_required,
            text_storage_allowed=self.text_storage_allowed,
        )


class TenantSafetyPolicy(models.Model):
    """A tenant's choices within its tier's bounds; blank takes the tier's default."""

    tenant = models.OneToOneField(
        "tenants.Tenant", on_delete=models.CASCADE, related_name="safety_policy"
    )
    classifier_action = models.CharField(max_length=8, choices=CHECK_CHOICES, blank=True)
    classifier_threshold = models.FloatField(null=True, blank=True, validators=UNIT)
    pii_action = models.CharField(max_length=8, choices=PII_CHOICES, blank=True)
    deny_action = models.CharField(max_length=8, choices=CHECK_CHOICES, blank=True)
    # One term (a word or phrase) per line.
    deny_terms = models.TextField(blank=True)
    output_moderation = models.BooleanField(null=True, blank=True)
    store_text = models.BooleanField(
        default=False, help_text="Keep the text of flagged events (PII redacted) for review."
    )
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        verbose_name_plural = "tenant safety policies"

    def __str__(self) -> str:
        return f"Safety policy of {self.tenant}"

    def get_additional_data(self) -> dict:
        return {"tenant_id": self.tenant_id}

    def choices(self) -> TenantChoices:
        from safety.checks.denylist import normalize_terms

        return TenantChoices(
            classifier_action=Action(self.classifier_action) if self.classifier_action else None,
            classifier_threshold=self.classifier_threshold,
            pii_action=Action(self.pii_action) if self.pii_action else None,
            deny_action=Action(self.deny_action) if self.deny_action else None,
            deny_terms=normalize_terms(self.deny_terms),
            output_moderation=self.output_moderation,
            store_text=self.store_text,
        )


class SafetyEvent(models.Model):
    """One prompt or reply that a check flagged, redacted, refused or cut.

    The text itself is kept only when the tenant opted in (PII redacted);
    otherwise its SHA-256 and length, enough to match a report to a request.
    """

    class Stage(models.TextChoices):
        PROMPT = "prompt", "Prompt"
        OUTPUT = "output", "Reply"

    class Outcome(models.TextChoices):
        FLAGGED = "flagged", "Flagged"
        REDACTED = "redacted", "Redacted"
        BLOCKED = "blocked", "Blocked"

    tenant = models.ForeignKey("tenants.Tenant", on_delete=models.CASCADE, related_name="+")
    api_key = models.ForeignKey(
        "tenants.ApiKey", on_delete=models.SET_NULL, null=True, blank=True, related_name="+"
    )
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        related_name="+",
    )
    source = models.CharField(max_length=16, blank=True)  # api, console
    stage = models.CharField(max_length=8, choices=Stage.choices)
    outcome = models.CharField(max_length=8, choices=Outcome.choices)
    model = models.CharField(max_length=128, blank=True)
    # The response id of a reply; the x-request-id of a refused prompt.
    request_ref = models.CharField(max_length=64, blank=True)
    # [{"check", "category", "score"}]
    findings = models.JSONField(default=list)
    text = models.TextField(blank=True)
    text_sha256 = models.CharField(max_length=64, blank=True)
    text_chars = models.PositiveIntegerField(default=0)
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [models.Index(fields=["tenant", "-created_at"])]

    def __str__(self) -> str:
        return f"{self.stage} {self.outcome} ({self.tenant_id})"
