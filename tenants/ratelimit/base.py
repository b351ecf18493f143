"""What the limiters share: the limits, a reservation ticket and the decision.

Both backends (Redis + Lua, and the in-process one of embedded mode) keep
the same state and return the same raw snapshot; ``decision_from`` turns
that snapshot into a ``Decision`` with OpenAI's ``x-ratelimit-*`` headers,
so the two cannot drift apart in what a client sees.

Windows slide: per scope (API key, tenant) the limiters keep a log of the
requests admitted in the last ``window_ms`` (one minute) with the tokens
each reserved, so no window of that length, wherever it starts, holds more
than the limit (a fixed window admits twice the limit across its edge). A
request counts one request and reserves ``prompt + n * max_tokens`` tokens
in both scopes' logs and in the tenant's monthly quota, settled to the real
usage at the response's end.

Concurrency slots and quota reservations are leases: the owner renews them
while its response lives (``renew``); an owner that dies stops renewing, and
within one lease its slot is free and its quota reservation refunded.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Protocol

WINDOW_MS = 60_000
# Refusal outcomes, in the order they are checked.
QUOTA, REQUESTS, TOKENS, CONCURRENCY = "quota", "requests", "tokens", "concurrency"
ADMITTED = "ok"
# The monthly counter is not known yet: call again with the usage so far.
NEEDS_SEED = "seed"
# A concurrency refusal has no window to wait for; slots free up as
# responses end, so a short retry is the honest hint.
CONCURRENCY_RETRY_MS = 1000


@dataclass(slots=True, frozen=True)
class Limits:
    """A ticket's limits; a batch line's (``batch_limits``) bind only its quota."""

    key_rpm: int
    key_tpm: int
    tenant_rpm: int
    tenant_tpm: int
    max_concurrent: int
    monthly_quota: int


# A window or slot count no batch line can reach: batch lines are bounded by
# the Batch API's own in-flight caps and the tier's batch_queue_tokens.
UNBOUNDED = 10**12


def batch_limits(limits: Limits) -> Limits:
    """A batch line's limits: no RPM, TPM or concurrency of its own, the same
    monthly quota (batch tokens are tokens the tenant used that month)."""
    return Limits(
        key_rpm=UNBOUNDED,
        key_tpm=UNBOUNDED,
        tenant_rpm=UNBOUNDED,
        tenant_tpm=UNBOUNDED,
        max_concurrent=UNBOUNDED,
        monthly_quota=limits.monthly_quota,
    )


@dataclass(slots=True, frozen=True)
class Ticket:
    """Names one response's reservation: its scopes and its quota month."""

    response_id: str
    # None for a console request, made with a session rather than a key.
    api_key_id: int | None
    tenant_id: int
    # "YYYYMM" (UTC) of the admission: the month the tokens are charged to.
    period: str
    # A Batch API line: its request and token windows and its concurrency
    # slots are scopes of their own (``b:``), apart from the interactive
    # ones, as OpenAI's batches do not count against RPM/TPM; the monthly
    # quota and the reservations are the tenant's, shared with interactive.
    batch: bool = False

    @classmethod
    def for_response(
        cls, *, response_id: str, api_key_id: int | None, tenant_id: int, batch: bool = False
    ) -> Ticket:
        period = time.strftime("%Y%m", time.gmtime())
        return cls(response_id, api_key_id, tenant_id, period, batch)

    @property
    def key_scope(self) -> str:
        """The key's request and token windows."""
        # Console requests share one window per tenant, limited like the
        # tenant scope (limits_for_tenant), so only the tenant limits bind.
        lane = "b:" if self.batch else ""
        if self.api_key_id is None:
            return f"{lane}c:{self.tenant_id}"
        return f"{lane}k:{self.api_key_id}"

    @property
    def tenant_scope(self) -> str:
        """The tenant's request and token windows and its concurrency slots."""
        return f"b:t:{self.tenant_id}" if self.batch else self.quota_scope

    @property
    def quota_scope(self) -> str:
        """The tenant's monthly quota and its reservations: one for both lanes."""
        return f"t:{self.tenant_id}"


@dataclass(slots=True, frozen=True)
class Snapshot:
    """Raw state after a check: each scope's use of its sliding window.

    ``*_reset_ms``: until the scope's log is empty again (OpenAI's reset:
    the limit fully restored). ``retry_ms``: until the refused request
    would fit (0 when admitted).
    """

    outcome: str
    now_ms: int
    key_requests: int
    key_tokens: int
    key_reset_ms: int
    tenant_requests: int
    tenant_tokens: int
    tenant_reset_ms: int
    retry_ms: int


@dataclass(slots=True, frozen=True)
class Decision:
    outcome: str
    retry_after_ms: int
    limit_requests: int
    remaining_requests: int
    reset_requests_ms: int
    limit_tokens: int
    remaining_tokens: int
    reset_tokens_ms: int

    @property
    def admitted(self) -> bool:
        return self.outcome == ADMITTED

    def headers(self) -> dict[str, str]:
        return {
            "x-ratelimit-limit-requests": str(self.limit_requests),
            "x-ratelimit-remaining-requests": str(self.remaining_requests),
            "x-ratelimit-reset-requests": format_reset(self.reset_requests_ms),
            "x-ratelimit-limit-tokens": str(self.limit_tokens),
            "x-ratelimit-remaining-tokens": str(self.remaining_tokens),
            "x-ratelimit-reset-tokens": format_reset(self.reset_tokens_ms),
        }


class Limiter(Protocol):
    def count(self, *, ticket: Ticket, limits: Limits) -> Snapshot:
        """Count the request alone (no tokens) in both scopes' request windows,
        when both have room (outcome ``requests`` otherwise). ``admit`` for
        the same ticket then adds its tokens without counting it twice."""

    def admit(
        self, *, ticket: Ticket, limits: Limits, tokens: int, quota_seed: int | None = None
    ) -> Snapshot:
        """Check every limit and, when all pass, take the request and its tokens."""

    def settle(self, *, ticket: Ticket, tokens: int, quota_tokens: int) -> bool:
        """Free the slot; correct the reservation to ``tokens`` (window) and
        ``quota_tokens`` (month). Idempotent: False when already settled."""

    def renew(self, *, ticket: Ticket) -> bool:
        """Extend the slot's lease by one lease from now; False when it is gone
        (settled, or expired and refunded: the owner stopped renewing)."""

    def quota_used(self, *, tenant_id: int, period: str) -> int | None:
        """The month's counter (None when not seeded), for tests and the admin."""


def format_reset(ms: int) -> str:
    """OpenAI's reset duration: ``"20ms"``, ``"1s"``, ``"6m0s"``, ``"1h0m0s"``."""
    ms = max(0, int(ms))
    if ms < 1000:
        return f"{ms}ms"
    hours, rest = divmod(math.ceil(ms / 1000), 3600)
    minutes, seconds = divmod(rest, 60)
    if hours:
        return f"{hours}h{minutes}m{seconds}s"
    if minutes:
        return f"{minutes}m{seconds}s"
    return f"{seconds}s"


def decision_from(snapshot: Snapshot, limits: Limits) -> Decision:
    """The decision and headers; each header reports the scope closest to its limit."""
    s = snapshot
    key_reset, tenant_reset = s.key_reset_ms, s.tenant_reset_ms
    requests = min(
        (
            (max(0, limits.key_rpm - s.key_requests), key_reset, limits.key_rpm),
            (max(0, limits.tenant_rpm - s.tenant_requests), tenant_reset, limits.tenant_rpm),
        ),
        key=lambda state: state[0],
    )
    tokens = min(
        (
            (max(0, limits.key_tpm - s.key_tokens), key_reset, limits.key_tpm),
            (max(0, limits.tenant_tpm - s.tenant_tokens), tenant_reset, limits.tenant_tpm),
        ),
        key=lambda state: state[0],
    )
    retry = 0
    if s.outcome in (REQUESTS, TOKENS):
        retry = s.retry_ms
    elif s.outcome == CONCURRENCY:
        retry = CONCURRENCY_RETRY_MS
    return Decision(
        outcome=s.outcome,
        retry_after_ms=retry,
        limit_requests=requests[2],
        remaining_requests=requests[0],
        reset_requests_ms=requests[1],
        limit_tokens=tokens[2],
        remaining_tokens=tokens[0],
        reset_tokens_ms=tokens[1],
    )
