"""A response's usage as the worker reports it: the schema of the usage stream.

The web tier attaches a ``UsageTag`` to each billed ``GenerationRequest``
(who to bill and which claims to settle); the worker echoes it back in one
``UsageEntry`` per response at its terminal event, with the token counts
and timings only the worker knows for sure. Billing's settler turns each
entry into the response's one UsageRecord (docs/architecture.md, "Usage
settlement"). Requests without a tag (shadow copies, warm-up) are not billed
and produce no entry.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, fields
from typing import Any

from wire.events import EventType, Terminal, TokenUsage

# Version of the entry's JSON: a settler refuses entries of a newer schema
# rather than misread them.
SCHEMA_VERSION = 1

STATUSES = frozenset(
    {EventType.COMPLETED, EventType.INCOMPLETE, EventType.FAILED, EventType.CANCELLED}
)
# The finish reason a record gets when the terminal event names none.
DEFAULT_FINISH_REASON = {
    EventType.FAILED: "error",
    EventType.CANCELLED: "abort",
    EventType.INCOMPLETE: "content_filter",
    EventType.COMPLETED: "stop",
}


class InvalidUsageEntry(ValueError):
    """An entry that cannot be settled as it is (a poison entry)."""


@dataclass(slots=True, frozen=True)
class UsageTag:
    """What the web tier knows at admission and the usage record needs."""

    # None for a console request (made with a session, not a key).
    api_key_id: int | None = None
    user_id: int | None = None
    # "api" or "console" (billing's UsageRecord.Source).
    source: str = "api"
    regenerated: bool = False
    # The tier the response was admitted on and the price its budget hold
    # was priced at (None: none known; billing looks them up).
    tier_id: int | None = None
    price_id: int | None = None
    # The budget ledger account holding the response's hold (None: nothing held).
    budget_account: str | None = None
    # "YYYYMM": the month the rate limiter charged the reservation to.
    quota_period: str = ""
    # The scheduling class served at (wire.requests.ServiceClass's value,
    # OpenAI's service_tier as used): the price's multiplier applies.
    service_tier: str = "default"

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> UsageTag:
        return cls(**{k: v for k, v in data.items() if k in _TAG_FIELDS})


_TAG_FIELDS = frozenset(f.name for f in fields(UsageTag))


@dataclass(slots=True, frozen=True)
class UsageEntry:
    """One response's terminal usage, as appended to the usage stream."""

    response_id: str
    tenant_id: int
    model: str
    status: str
    finish_reason: str
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int
    queue_time_ms: int
    ttft_ms: int | None
    duration_ms: int
    # Unix seconds: when the web tier enqueued the request (the month it is
    # billed in) and when the worker ended it.
    created_at: float
    finished_at: float
    worker_id: str = ""
    model_version: str = ""
    tag: UsageTag = UsageTag()

    def to_json(self) -> str:
        return json.dumps({"v": SCHEMA_VERSION, **asdict(self)}, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str | bytes) -> UsageEntry:
        """Parse and check an entry; raises InvalidUsageEntry saying what is wrong."""
        try:
            data = json.loads(text)
        except (TypeError, ValueError) as exc:
            raise InvalidUsageEntry(f"not JSON: {exc}") from exc
        if not isinstance(data, dict):
            raise InvalidUsageEntry("not a JSON object")
        if data.get("v") != SCHEMA_VERSION:
            raise InvalidUsageEntry(f"unknown schema version {data.get('v')!r}")
        tag = data.get("tag") or {}
        if not isinstance(tag, dict):
            raise InvalidUsageEntry("tag is not an object")
        try:
            entry = cls(
                **{k: v for k, v in data.items() if k in _ENTRY_FIELDS and k != "tag"},
                tag=UsageTag.from_dict(tag),
            )
        except TypeError as exc:
            raise InvalidUsageEntry(f"missing fields: {exc}") from exc
        entry.check()
        return entry

    def check(self) -> None:
        """Raise InvalidUsageEntry unless every field has a settleable value."""
        if not isinstance(self.response_id, str) or not 0 < len(self.response_id) <= 64:
            raise InvalidUsageEntry("response_id must be a string of 1..64 characters")
        if not _is_int(self.tenant_id):
            raise InvalidUsageEntry("tenant_id must be an integer")
        if self.status not in STATUSES:
            raise InvalidUsageEntry(f"unknown status {self.status!r}")
        counts = ("prompt_tokens", "cached_tokens", "completion_tokens")
        for name in (*counts, "queue_time_ms", "duration_ms"):
            value = getattr(self, name)
            if not _is_int(value) or value < 0:
                raise InvalidUsageEntry(f"{name} must be a non-negative integer")
        if self.ttft_ms is not None and (not _is_int(self.ttft_ms) or self.ttft_ms < 0):
            raise InvalidUsageEntry("ttft_ms must be a non-negative integer or null")
        for name in ("created_at", "finished_at"):
            value = getattr(self, name)
            if (
                not isinstance(value, int | float)
                or isinstance(value, bool)
                or not (math.isfinite(value) and value > 0)
            ):
                raise InvalidUsageEntry(f"{name} must be a positive unix time")
        for name in ("api_key_id", "user_id", "tier_id", "price_id"):
            value = getattr(self.tag, name)
            if value is not None and not _is_int(value):
                raise InvalidUsageEntry(f"tag.{name} must be an integer or null")


_ENTRY_FIELDS = frozenset(f.name for f in fields(UsageEntry))


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _ms(value: float | None) -> int | None:
    return None if value is None else max(0, round(value))


def usage_entry(
    *,
    response_id: str,
    tenant_id: int,
    model: str,
    tag: UsageTag,
    terminal: Terminal,
    created_at: float,
    finished_at: float,
    usage: TokenUsage | None = None,
    worker_id: str = "",
    model_version: str = "",
) -> UsageEntry:
    """The one usage record of a response, from its terminal event.

    ``usage`` replaces the terminal's token counts when the reader counted
    better (the relay's, for an ending that carries none). The worker and
    the relay both build their entries here; billing writes the record from
    the entry (``billing.services.settlement``), nowhere else.
    """
    tokens = terminal.usage if usage is None else usage
    metrics = terminal.metrics
    status = EventType(terminal.type)
    return UsageEntry(
        response_id=response_id,
        tenant_id=tenant_id,
        model=model,
        status=status.value,
        finish_reason=terminal.finish_reason or DEFAULT_FINISH_REASON[status],
        prompt_tokens=tokens.prompt_tokens,
        cached_tokens=min(tokens.prompt_tokens, tokens.cached_tokens),
        completion_tokens=tokens.completion_tokens,
        queue_time_ms=_ms(metrics.queue_time_ms) or 0,
        ttft_ms=_ms(metrics.ttft_ms),
        duration_ms=_ms(metrics.duration_ms) or 0,
        created_at=created_at,
        finished_at=finished_at,
        worker_id=worker_id,
        model_version=model_version,
        tag=tag,
    )
