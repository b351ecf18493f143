"""Usage records: one row per response, written exactly once."""

from decimal import Decimal

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import models
from django.utils import timezone


class UsageRecord(models.Model):
    """What one response consumed. ``response_id`` is the idempotency key.

    The relay and the worker may both try to settle the same response (a
    reconnect, a retried task); the unique constraint makes the second write
    a no-op instead of a double charge.
    """

    class Source(models.TextChoices):
        API = "api", "API"
        CONSOLE = "console", "Console"
        # A Batch API line (batches/): billed at BATCH_PRICE_MULTIPLIER.
        BATCH = "batch", "Batch"

    class Status(models.TextChoices):
        COMPLETED = "completed", "Completed"
        INCOMPLETE = "incomplete", "Incomplete"
        FAILED = "failed", "Failed"
        CANCELLED = "cancelled", "Cancelled"

    response_id = models.CharField(max_length=64, unique=True)
    # PROTECT: usage is billing history and outlives neither tenants nor audits.
    tenant = models.ForeignKey(
        "tenants.Tenant", on_delete=models.PROTECT, related_name="usage_records"
    )
    # Console requests are made with a session, not a key.
    api_key = models.ForeignKey(
        "tenants.ApiKey",
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        related_name="usage_records",
    )
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        related_name="usage_records",
    )
    model = models.CharField(max_length=128)
    source = models.CharField(max_length=16, choices=Source.choices)
    status = models.CharField(max_length=16, choices=Status.choices)
    # stop, length, content_filter, abort, error, ...; blank when none applies.
    finish_reason = models.CharField(max_length=32, blank=True)
    prompt_tokens = models.PositiveIntegerField()
    # Prompt tokens served from the prefix cache (a subset of prompt_tokens).
    cached_tokens = models.PositiveIntegerField(default=0)
    completion_tokens = models.PositiveIntegerField()
    queue_time_ms = models.PositiveIntegerField(default=0)
    # None when the response ended before its first token.
    ttft_ms = models.PositiveIntegerField(null=True, blank=True)
    duration_ms = models.PositiveIntegerField(default=0)
    worker_id = models.CharField(max_length=128, blank=True)
    # The deployment version the worker ran (canary vs stable guardrails).
    model_version = models.CharField(max_length=64, blank=True)
    # A console "Regenerate" of an earlier reply: a quality signal for rollouts.
    regenerated = models.BooleanField(default=False)
    # What the response is billed at: the tenant's tier when it was admitted
    # and the price in force for it then, so a later tier change or a
    # back-dated price never reprices it. Null price: none was in force
    # (invoices then look the tier's price up for the record's day).
    tier = models.ForeignKey(
        "tenants.Tier", on_delete=models.PROTECT, null=True, blank=True, related_name="+"
    )
    price = models.ForeignKey(
        "billing.Price", on_delete=models.PROTECT, null=True, blank=True, related_name="+"
    )

    class ServiceTier(models.TextChoices):
        PRIORITY = "priority", "Priority"
        DEFAULT = "default", "Default"
        FLEX = "flex", "Flex"
        BATCH = "batch", "Batch"

    # The scheduling class the response was served at (OpenAI's
    # service_tier as actually used): priced at the price's multiplier.
    service_tier = models.CharField(
        max_length=8, choices=ServiceTier.choices, default=ServiceTier.DEFAULT
    )
    # The fraction of ``price`` this response pays (batch lines: the batch
    # discount in force when it was recorded), so a later change of the
    # discount never reprices it.
    price_multiplier = models.DecimalField(max_digits=4, decimal_places=3, default=Decimal(1))
    created_at = models.DateTimeField(default=timezone.now)
    # The invoice that billed this record; null until one does. Usually the
    # invoice of its month, but a record settled after that invoice was
    # issued is billed by the tenant's next one, as an adjustment line.
    invoice = models.ForeignKey(
        "billing.Invoice",
        on_delete=models.PROTECT,
        null=True,
        blank=True,
        related_name="usage_records",
    )

    class Meta:
        ordering = ["-created_at"]
        indexes = [
            models.Index(fields=["tenant", "created_at"], name="usage_tenant_created_idx"),
            # What the next invoice must still bill: a few rows at most,
            # once a month is issued.
            models.Index(
                fields=["tenant", "created_at"],
                condition=models.Q(invoice__isnull=True),
                name="usage_unbilled_idx",
            ),
        ]
        constraints = [
            models.CheckConstraint(
                condition=models.Q(cached_tokens__lte=models.F("prompt_tokens")),
                name="usage_cached_within_prompt",
            )
        ]

    def __str__(self) -> str:
        return f"{self.response_id} {self.tenant_id} {self.total_tokens} tokens"

    def clean(self) -> None:
        super().clean()
        if (
            self.cached_tokens is not None
            and self.prompt_tokens is not None
            and self.cached_tokens > self.prompt_tokens
        ):
            raise ValidationError({"cached_tokens": "Cannot exceed prompt_tokens."})

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


class UsageDeadLetter(models.Model):
    """A usage-stream entry the settler could not turn into a record.

    Set aside so it never blocks the entries behind it (unparseable, an
    unknown tenant, a constraint the record breaks); shown in the admin,
    where an operator can retry it once the cause is fixed or delete it.
    """

    class Reason(models.TextChoices):
        UNPARSEABLE = "unparseable", "Unparseable"
        UNKNOWN_TENANT = "unknown_tenant", "Unknown tenant"
        INVALID = "invalid", "Invalid record"
        # Anything else the entry raised while settling (a bug, a value no
        # check foresaw): set aside so the batch behind it settles.
        ERROR = "error", "Error while settling"

    # The stream entry's id (unique per stream, not across stream resets).
    entry_id = models.CharField(max_length=64)
    # Blank when the entry could not be parsed far enough to know it.
    response_id = models.CharField(max_length=64, blank=True, db_index=True)
    reason = models.CharField(max_length=32, choices=Reason.choices)
    error = models.TextField()
    payload = models.TextField(blank=True)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"{self.entry_id} {self.reason}: {self.error[:60]}"
