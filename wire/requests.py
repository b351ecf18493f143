"""The generation request: what the web tier enqueues for one worker."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from enum import StrEnum

from wire.sampling import Sampling
from wire.usage.entry import UsageTag


class ServiceClass(StrEnum):
    """A request's scheduling class within its tenant's tier.

    ``DEFAULT`` is every interactive request's today; OpenAI's
    ``service_tier`` (priority, default, flex) picks among the first three,
    and Batch API lines run as ``BATCH``, below every interactive class.
    """

    PRIORITY = "priority"
    DEFAULT = "default"
    FLEX = "flex"
    BATCH = "batch"


@dataclass(slots=True)
class GenerationRequest:
    """One admitted request, as enqueued on a worker's request stream."""

    response_id: str
    model: str
    prompt_token_ids: list[int]
    sampling: Sampling
    priority: int = 0
    tier: str = "free"
    tenant_id: int | None = None
    service_class: ServiceClass = ServiceClass.DEFAULT
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
