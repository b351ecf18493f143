"""Files and batches (OpenAI's Files and Batch API), one row per line in flight.

A batch's input file is checked and split into ``BatchLine`` rows once
(status ``validating``); from then on each line is the unit of work: it is
claimed, run through the request path and ends as exactly one output or
error record. The files themselves live in the ``batches`` storage
(``settings.STORAGES``); rows keep only their name there.
"""

from __future__ import annotations

import secrets

from django.db import models
from django.utils import timezone


def new_file_id() -> str:
    return f"file-{secrets.token_hex(12)}"


def new_batch_id() -> str:
    return f"batch_{secrets.token_hex(12)}"


class File(models.Model):
    """An uploaded (``batch``) or produced (``batch_output``) JSONL file."""

    class Purpose(models.TextChoices):
        BATCH = "batch", "Batch input"
        BATCH_OUTPUT = "batch_output", "Batch output"

    id = models.CharField(primary_key=True, max_length=40, default=new_file_id, editable=False)
    tenant = models.ForeignKey("tenants.Tenant", on_delete=models.CASCADE, related_name="files")
    purpose = models.CharField(max_length=16, choices=Purpose.choices)
    filename = models.CharField(max_length=255)
    bytes = models.PositiveBigIntegerField()
    # The name in the batches storage (a path, or an object key on S3).
    storage_name = models.CharField(max_length=255)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [models.Index(fields=["tenant", "created_at"], name="file_tenant_created_idx")]

    def __str__(self) -> str:
        return f"{self.id} {self.filename}"


class Batch(models.Model):
    """One batch: its input's lines, their progress, and the files they produced."""

    class Status(models.TextChoices):
        VALIDATING = "validating"
        FAILED = "failed"
        IN_PROGRESS = "in_progress"
        FINALIZING = "finalizing"
        COMPLETED = "completed"
        EXPIRED = "expired"
        CANCELLING = "cancelling"
        CANCELLED = "cancelled"

    TERMINAL = (Status.FAILED, Status.COMPLETED, Status.EXPIRED, Status.CANCELLED)

    class Endpoint(models.TextChoices):
        CHAT = "/v1/chat/completions"
        COMPLETIONS = "/v1/completions"

    id = models.CharField(primary_key=True, max_length=40, default=new_batch_id, editable=False)
    tenant = models.ForeignKey("tenants.Tenant", on_delete=models.CASCADE, related_name="batches")
    # Lines run with the key that created the batch (its model allow-list
    # and per-key limits apply); a revoked key fails the remaining lines.
    api_key = models.ForeignKey(
        "tenants.ApiKey", on_delete=models.SET_NULL, null=True, related_name="batches"
    )
    endpoint = models.CharField(max_length=32, choices=Endpoint.choices)
    # The id, not a key: the input may be deleted once its lines are read.
    input_file_id = models.CharField(max_length=40)
    completion_window = models.CharField(max_length=8, default="24h")
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.VALIDATING)
    output_file = models.ForeignKey(
        File, on_delete=models.SET_NULL, null=True, blank=True, related_name="+"
    )
    error_file = models.ForeignKey(
        File, on_delete=models.SET_NULL, null=True, blank=True, related_name="+"
    )
    # Validation errors: OpenAI's [{code, message, param, line}].
    errors = models.JSONField(null=True, blank=True)
    metadata = models.JSONField(null=True, blank=True)
    # Why the remaining lines stopped early (insufficient_quota), if they did.
    stop_code = models.CharField(max_length=32, blank=True)
    # Last sign of life of a feed task (the sweep re-feeds a batch whose
    # feeder died with its Celery worker).
    fed_at = models.DateTimeField(null=True, blank=True)
    # Its lines' prompt tokens plus all they may generate (batches.tokens):
    # what counts against the tier's batch_queue_tokens while it runs.
    enqueued_tokens = models.PositiveBigIntegerField(default=0)
    total = models.PositiveIntegerField(default=0)
    completed = models.PositiveIntegerField(default=0)
    failed = models.PositiveIntegerField(default=0)
    created_at = models.DateTimeField(default=timezone.now)
    expires_at = models.DateTimeField()
    in_progress_at = models.DateTimeField(null=True, blank=True)
    finalizing_at = models.DateTimeField(null=True, blank=True)
    completed_at = models.DateTimeField(null=True, blank=True)
    failed_at = models.DateTimeField(null=True, blank=True)
    expired_at = models.DateTimeField(null=True, blank=True)
    cancelling_at = models.DateTimeField(null=True, blank=True)
    cancelled_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [
            models.Index(fields=["tenant", "created_at"], name="batch_tenant_created_idx"),
            models.Index(fields=["status", "expires_at"], name="batch_status_expires_idx"),
        ]

    def __str__(self) -> str:
        return f"{self.id} {self.status}"

    @property
    def done(self) -> bool:
        return self.status in self.TERMINAL


class BatchLine(models.Model):
    """One request of a batch, from its input line to its one result record."""

    class Status(models.TextChoices):
        PENDING = "pending"
        RUNNING = "running"
        SUCCEEDED = "succeeded"
        FAILED = "failed"

    batch = models.ForeignKey(Batch, on_delete=models.CASCADE, related_name="lines")
    # 1-based, as the validation errors number them.
    line = models.PositiveIntegerField()
    custom_id = models.CharField(max_length=512)
    body = models.JSONField()
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.PENDING)
    # The response id the line runs (and is billed) under: the same on
    # every attempt, so its usage record is written once.
    response_id = models.CharField(max_length=64, unique=True)
    # Renewed by the live feeder every few seconds; older than
    # BATCH_LINE_LEASE_SECONDS: the feeder died and the line is free again.
    claimed_at = models.DateTimeField(null=True, blank=True)
    # Claims so far: a line claimed before may have reached a worker, whose
    # answer is read back (resumed) rather than generated twice.
    attempts = models.PositiveSmallIntegerField(default=0)
    # The output or error file's record for this line (OpenAI's shape).
    result = models.JSONField(null=True, blank=True)

    class Meta:
        ordering = ["batch", "line"]
        constraints = [
            models.UniqueConstraint(
                fields=["batch", "custom_id"], name="batchline_custom_id_unique"
            ),
            models.UniqueConstraint(fields=["batch", "line"], name="batchline_line_unique"),
        ]
        indexes = [models.Index(fields=["batch", "status", "line"], name="batchline_status_idx")]

    def __str__(self) -> str:
        return f"{self.batch_id}:{self.line} {self.status}"
