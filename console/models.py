"""Console conversations: a user's multi-turn chats and their messages."""

from django.conf import settings
from django.db import models


class Conversation(models.Model):
    """One user's chat thread. Private to its user, scoped to the user's tenant."""

    tenant = models.ForeignKey(
        "tenants.Tenant", on_delete=models.CASCADE, related_name="conversations"
    )
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="conversations"
    )
    title = models.CharField(max_length=200, blank=True)
    # The model of the latest reply; Regenerate asks it again.
    model = models.CharField(max_length=128)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["-updated_at", "-id"]
        indexes = [
            models.Index(fields=["tenant", "user", "-updated_at"], name="console_conv_owner_idx")
        ]

    def __str__(self) -> str:
        return self.title or f"Conversation {self.pk}"


class Message(models.Model):
    class Role(models.TextChoices):
        USER = "user", "User"
        ASSISTANT = "assistant", "Assistant"

    class Status(models.TextChoices):
        IN_PROGRESS = "in_progress", "In progress"
        COMPLETED = "completed", "Completed"
        INCOMPLETE = "incomplete", "Incomplete"
        FAILED = "failed", "Failed"
        CANCELLED = "cancelled", "Cancelled"

    conversation = models.ForeignKey(
        Conversation, on_delete=models.CASCADE, related_name="messages"
    )
    role = models.CharField(max_length=16, choices=Role.choices)
    content = models.TextField(blank=True)
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.COMPLETED)
    # Assistant replies only: the response on the bus, and where it runs.
    response_id = models.CharField(max_length=64, unique=True, null=True, blank=True)
    worker_id = models.CharField(max_length=128, blank=True)
    model = models.CharField(max_length=128, blank=True)
    finish_reason = models.CharField(max_length=32, blank=True)
    prompt_tokens = models.PositiveIntegerField(default=0)
    completion_tokens = models.PositiveIntegerField(default=0)
    error = models.TextField(blank=True)
    # A reply answered again by Regenerate: kept for the record, left out
    # of the transcript and of later prompts.
    superseded = models.BooleanField(default=False)
    regenerated = models.BooleanField(default=False)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["created_at", "id"]

    def __str__(self) -> str:
        return f"{self.role}: {self.content[:40]}"

    @property
    def is_final(self) -> bool:
        return self.status != self.Status.IN_PROGRESS
