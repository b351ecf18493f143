"""Usage records in tests, written the one way the platform writes them.

``record_usage(**fields)`` takes a UsageRecord's fields, builds the
response's ``UsageEntry`` (``wire.usage``) and hands it to
``billing.services.usage_record_create``, so a test's record goes through
the same writer as the settler's and the relay's.
"""

from __future__ import annotations

import time
import uuid
from datetime import datetime

from billing.models import UsageRecord
from billing.services import usage_record_create
from wire.usage import UsageEntry, UsageTag

_TAG_FIELDS = (
    "api_key_id",
    "user_id",
    "source",
    "regenerated",
    "tier_id",
    "price_id",
    "service_tier",
)


def usage_entry_of(**fields) -> UsageEntry:
    """A UsageEntry from a UsageRecord's field names (``created_at`` a datetime)."""
    tag = UsageTag(**{k: fields.pop(k) for k in _TAG_FIELDS if k in fields})
    created_at = fields.pop("created_at", None)
    stamp = created_at.timestamp() if isinstance(created_at, datetime) else time.time()
    fields.setdefault("response_id", f"chatcmpl-{uuid.uuid4().hex}")
    for name in ("queue_time_ms", "duration_ms", "cached_tokens", "completion_tokens"):
        fields.setdefault(name, 0)
    fields.setdefault("ttft_ms", None)
    fields.setdefault("finish_reason", "")
    fields.setdefault("status", UsageRecord.Status.COMPLETED)
    return UsageEntry(created_at=stamp, finished_at=stamp, tag=tag, **fields)


def record_usage(**fields) -> tuple[UsageRecord, bool]:
    """``usage_record_create`` for the entry of these fields: ``(record, created)``."""
    return usage_record_create(entry=usage_entry_of(**fields))
