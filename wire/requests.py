"""The generation request: what the web tier enqueues for one worker."""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from wire.usage.entry import UsageTag


@dataclass(slots=True)
class GenerationRequest:
    """One admitted request, as enqueued on a worker's request stream."""

    response_id: str
    model: str
    prompt_token_ids: list[int]
    # The engine's SamplingParams fields, as plain JSON values (the worker
    # builds gpuworkers.engine.SamplingParams from them).
    sampling: dict[str, Any]
    priority: int = 0
    tier: str = "free"
    tenant_id: int | None = None
    # Per-tenant prefix-cache salt: tenants never share cached KV blocks.
    cache_salt: str | None = None
    created_at: float = field(default_factory=time.time)
    # W3C trace context of the web tier's enqueue span, so the worker's
    # spans join the request's trace (wire.tracing); None when not traced.
    traceparent: str | None = None
    # The HTTP request's x-request-id, for the worker's spans and logs.
    request_id: str | None = None
    # Who the response is billed to and which claims settle it: the worker
    # echoes it in the response's usage entry (wire.usage). None: not billed
    # (shadow copies), so no entry is written.
    usage_tag: UsageTag | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> GenerationRequest:
        # Tolerant both ways during a rolling deploy: fields an older web
        # tier does not send take their defaults, fields a newer one adds
        # are ignored.
        known = {k: v for k, v in data.items() if k in _FIELDS}
        if isinstance(known.get("usage_tag"), dict):
            known["usage_tag"] = UsageTag.from_dict(known["usage_tag"])
        return cls(**known)


_FIELDS = frozenset(f.name for f in fields(GenerationRequest))
