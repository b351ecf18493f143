"""Reads for the console. Every read is scoped to the signed-in user's tenant.

Plain synchronous ORM functions; the chat consumer wraps them with
asgiref's ``sync_to_async``.
"""

from __future__ import annotations

import json
import statistics
import struct
from collections import defaultdict
from datetime import datetime, timedelta
from pathlib import Path

from auditlog.models import LogEntry
from django.contrib.auth import get_user_model
from django.contrib.auth.base_user import AbstractBaseUser
from django.db.models import QuerySet
from django.utils import timezone

from billing.models import UsageRecord
from console.capacity import ModelShape, shape_from_config
from console.models import Conversation, Message
from inference.request import ChatTurn
from tenants.models import Membership, Tenant
from wire.bus import get_bus
from wire.workers import WorkerInfo

# The fleet page's latency window.
TTFT_WINDOW = timedelta(minutes=15)


def conversation_list(*, user: AbstractBaseUser, tenant: Tenant) -> QuerySet[Conversation]:
    return Conversation.objects.filter(user=user, tenant=tenant).order_by("-updated_at", "-id")


def conversation_get(
    *, user: AbstractBaseUser, tenant: Tenant, conversation_id: int
) -> Conversation | None:
    """The user's conversation, or None (unknown, another user's or tenant's)."""
    return conversation_list(user=user, tenant=tenant).filter(pk=conversation_id).first()


def conversation_transcript(*, conversation: Conversation) -> list[Message]:
    """What the page shows: every turn except replies replaced by Regenerate."""
    return list(conversation.messages.filter(superseded=False).order_by("created_at", "id"))


def conversation_turns(*, conversation: Conversation) -> list[ChatTurn]:
    """The chat history as the prompt's turns.

    Replies that produced no text (failed before the first token) are left
    out: the model should not see an empty assistant turn.
    """
    return [
        ChatTurn(m.role, m.content)
        for m in conversation_transcript(conversation=conversation)
        if m.role == Message.Role.USER or m.content
    ]


def reply_get(*, user: AbstractBaseUser, tenant: Tenant, response_id: str) -> Message | None:
    """The assistant reply ``response_id`` if the user owns it, else None."""
    return (
        Message.objects.filter(
            response_id=response_id,
            role=Message.Role.ASSISTANT,
            conversation__user=user,
            conversation__tenant=tenant,
        )
        .select_related("conversation")
        .first()
    )


def membership_for_user(*, user: AbstractBaseUser) -> Membership | None:
    if not getattr(user, "is_authenticated", False):
        return None
    return (
        Membership.objects.select_related("tenant__tier")
        .filter(user=user, tenant__is_active=True)
        .first()
    )


def member_list(*, tenant: Tenant) -> QuerySet[Membership]:
    return (
        Membership.objects.filter(tenant=tenant).select_related("user").order_by("user__username")
    )


def member_users(*, tenant: Tenant) -> QuerySet:
    """The tenant's members as users (a key's possible owners)."""
    return get_user_model().objects.filter(membership__tenant=tenant).order_by("username")


def audit_entries(*, tenant: Tenant | None, limit: int = 200) -> QuerySet[LogEntry]:
    """The newest audit entries: every one (staff, ``tenant=None``) or the tenant's.

    A tenant's entries are those its rows wrote (``get_additional_data`` on
    the tenants and billing models); platform-wide rows (tiers, prices,
    deployments) are staff's alone.
    """
    entries = LogEntry.objects.select_related("actor", "content_type").order_by("-timestamp")
    if tenant is not None:
        entries = entries.filter(additional_data__tenant_id=tenant.pk)
    return entries[:limit]


async def worker_list() -> list[WorkerInfo]:
    """Workers with a live heartbeat, by id: the bus's view, never the database's."""
    # get_bus() picks the bus client of the running loop, so this must run
    # as a coroutine (a sync view calls it through async_to_sync).
    return sorted(await get_bus().list_workers(), key=lambda w: w.worker_id)


def ttft_percentiles(*, since: datetime | None = None) -> dict[str, dict[str, float | int]]:
    """TTFT p50/p95 (ms) and sample count per worker over the recent window.

    Percentiles over a 15-minute window are a few thousand values at most,
    so they are computed here rather than in SQL (which Django's ORM cannot
    express portably).
    """
    since = since or timezone.now() - TTFT_WINDOW
    samples: dict[str, list[int]] = defaultdict(list)
    rows = UsageRecord.objects.filter(created_at__gte=since, ttft_ms__isnull=False).values_list(
        "worker_id", "ttft_ms"
    )
    for worker_id, ttft in rows:
        samples[worker_id].append(ttft)
    result = {}
    for worker_id, values in samples.items():
        values.sort()
        if len(values) == 1:
            p50 = p95 = float(values[0])
        else:
            cuts = statistics.quantiles(values, n=100, method="inclusive")
            p50, p95 = cuts[49], cuts[94]
        result[worker_id] = {"p50": p50, "p95": p95, "count": len(values)}
    return result


def safetensors_parameter_count(path: Path) -> int:
    """Parameters stored in a .safetensors file, read from its header alone."""
    with path.open("rb") as handle:
        (header_len,) = struct.unpack("<Q", handle.read(8))
        header = json.loads(handle.read(header_len))
    total = 0
    for name, tensor in header.items():
        if name == "__metadata__":
            continue
        count = 1
        for dim in tensor["shape"]:
            count *= dim
        total += count
    return total


def model_shape_from_dir(model_dir: Path) -> ModelShape:
    """A served model's shape from its config.json and weight files."""
    config = json.loads((model_dir / "config.json").read_text())
    params = sum(safetensors_parameter_count(p) for p in model_dir.glob("*.safetensors"))
    return shape_from_config(config, params_billion=max(params, 1) / 1e9)
