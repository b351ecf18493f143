"""Embedded mode's limiter: the Lua scripts' semantics, in-process, under a lock.

One web process is the whole deployment in embedded mode, so a lock gives
the same atomicity Redis gives the shared limiter. State and outcomes
mirror tenants.ratelimit.scripts step for step.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import dataclass, field

from tenants.ratelimit.base import (
    ADMITTED,
    CONCURRENCY,
    NEEDS_SEED,
    QUOTA,
    REQUESTS,
    TOKENS,
    WINDOW_MS,
    Limits,
    Snapshot,
    Ticket,
)


@dataclass(slots=True)
class _Log:
    """One scope's sliding window: admissions oldest first, tokens per response."""

    entries: deque[tuple[int, str]] = field(default_factory=deque)
    tokens: dict[str, int] = field(default_factory=dict)
    total: int = 0

    def purge(self, now: int, window: int) -> None:
        while self.entries and self.entries[0][0] <= now - window:
            _, rid = self.entries.popleft()
            self.total -= self.tokens.pop(rid, 0)

    def reset_ms(self, now: int, window: int) -> int:
        return self.entries[-1][0] + window - now if self.entries else 0

    def wait_requests(self, limit: int, now: int, window: int) -> int:
        count = len(self.entries)
        if count + 1 <= limit:
            return 0
        if count - limit >= count:
            return window
        return self.entries[count - limit][0] + window - now

    def wait_tokens(self, need: int, limit: int, now: int, window: int) -> int:
        excess = self.total + need - limit
        if excess <= 0:
            return 0
        if need > limit:
            return window
        freed = 0
        for at, rid in self.entries:
            freed += self.tokens.get(rid, 0)
            if freed >= excess:
                return at + window - now
        return window


class MemoryLimiter:
    """Thread-safe in-process rate limits and quotas."""

    def __init__(self, *, lease_ms: int = 30_000, window_ms: int = WINDOW_MS):
        self.lease_ms = lease_ms
        self.window_ms = window_ms
        self._lock = threading.Lock()
        self._logs: dict[str, _Log] = {}
        # tenant scope (interactive or batch) -> {response id: lease expiry ms}
        self._inflight: dict[str, dict[str, int]] = {}
        self._quota: dict[tuple[str, str], int] = {}
        # response id -> (tokens reserved, period)
        self._reservations: dict[str, tuple[int, str]] = {}

    def _log(self, scope: str, now: int) -> _Log:
        log = self._logs.setdefault(scope, _Log())
        log.purge(now, self.window_ms)
        return log

    def _expire_leases(self, ticket: Ticket, now: int) -> dict[str, int]:
        # Leases that ran out: their owner stopped renewing (it died).
        inflight = self._inflight.setdefault(ticket.tenant_scope, {})
        for rid in [rid for rid, expiry in inflight.items() if expiry <= now]:
            del inflight[rid]
            reservation = self._reservations.pop(rid, None)
            quota_key = (ticket.quota_scope, ticket.period)
            if (
                reservation is not None
                and reservation[1] == ticket.period
                and quota_key in self._quota
            ):
                self._quota[quota_key] = max(0, self._quota[quota_key] - reservation[0])
        return inflight

    def count(self, *, ticket: Ticket, limits: Limits) -> Snapshot:
        now, window = int(time.time() * 1000), self.window_ms
        with self._lock:
            key = self._log(ticket.key_scope, now)
            tenant = self._log(ticket.tenant_scope, now)
            outcome, retry = ADMITTED, 0
            # A ticket already counted is not counted again (idempotent).
            if ticket.response_id not in key.tokens:
                retry = max(
                    key.wait_requests(limits.key_rpm, now, window),
                    tenant.wait_requests(limits.tenant_rpm, now, window),
                )
                if retry:
                    outcome = REQUESTS
                else:
                    for log in (key, tenant):
                        log.entries.append((now, ticket.response_id))
                        log.tokens[ticket.response_id] = 0
            return self._snapshot(outcome, now, key, tenant, retry)

    def _snapshot(self, outcome: str, now: int, key: _Log, tenant: _Log, retry: int) -> Snapshot:
        window = self.window_ms
        return Snapshot(
            outcome,
            now,
            len(key.entries),
            max(0, key.total),
            key.reset_ms(now, window),
            len(tenant.entries),
            max(0, tenant.total),
            tenant.reset_ms(now, window),
            retry,
        )

    def admit(
        self, *, ticket: Ticket, limits: Limits, tokens: int, quota_seed: int | None = None
    ) -> Snapshot:
        now, window = int(time.time() * 1000), self.window_ms
        with self._lock:
            inflight = self._expire_leases(ticket, now)
            key = self._log(ticket.key_scope, now)
            tenant = self._log(ticket.tenant_scope, now)
            quota_key = (ticket.quota_scope, ticket.period)
            if quota_key not in self._quota and quota_seed is not None:
                self._quota[quota_key] = int(quota_seed)
            outcome, retry = ADMITTED, 0
            # Counted ahead by count(): the request is in the log already.
            counted = ticket.response_id in key.tokens, ticket.response_id in tenant.tokens
            if quota_key not in self._quota:
                outcome = NEEDS_SEED
            elif self._quota[quota_key] + tokens > limits.monthly_quota:
                outcome = QUOTA
            elif retry := max(
                0 if counted[0] else key.wait_requests(limits.key_rpm, now, window),
                0 if counted[1] else tenant.wait_requests(limits.tenant_rpm, now, window),
            ):
                outcome = REQUESTS
            elif retry := max(
                key.wait_tokens(tokens, limits.key_tpm, now, window),
                tenant.wait_tokens(tokens, limits.tenant_tpm, now, window),
            ):
                outcome = TOKENS
            elif len(inflight) >= limits.max_concurrent:
                outcome = CONCURRENCY
            else:
                for log, was_counted in zip((key, tenant), counted, strict=True):
                    if not was_counted:
                        log.entries.append((now, ticket.response_id))
                    log.tokens[ticket.response_id] = log.tokens.get(ticket.response_id, 0) + tokens
                    log.total += tokens
                inflight[ticket.response_id] = now + self.lease_ms
                self._quota[quota_key] += tokens
                self._reservations[ticket.response_id] = (tokens, ticket.period)
            return self._snapshot(outcome, now, key, tenant, retry)

    def settle(self, *, ticket: Ticket, tokens: int, quota_tokens: int) -> bool:
        with self._lock:
            self._inflight.get(ticket.tenant_scope, {}).pop(ticket.response_id, None)
            reservation = self._reservations.pop(ticket.response_id, None)
            if reservation is None:
                return False
            delta = max(0, tokens) - reservation[0]
            for scope in (ticket.key_scope, ticket.tenant_scope):
                log = self._logs.get(scope)
                # Only while the entry is still in its window.
                if log is not None and ticket.response_id in log.tokens:
                    log.tokens[ticket.response_id] += delta
                    log.total = max(0, log.total + delta)
            quota_key = (ticket.quota_scope, ticket.period)
            if quota_key in self._quota:
                used = self._quota[quota_key] + max(0, quota_tokens) - reservation[0]
                self._quota[quota_key] = max(0, used)
            return True

    def renew(self, *, ticket: Ticket) -> bool:
        now = int(time.time() * 1000)
        with self._lock:
            inflight = self._inflight.get(ticket.tenant_scope, {})
            expiry = inflight.get(ticket.response_id)
            if expiry is None or expiry <= now:
                return False
            inflight[ticket.response_id] = now + self.lease_ms
            return True

    def quota_used(self, *, tenant_id: int, period: str) -> int | None:
        with self._lock:
            return self._quota.get((f"t:{tenant_id}", period))

    def in_flight(self, *, tenant_id: int) -> int:
        """Interactive slots held now by the tenant (batch lines hold none)."""
        now = int(time.time() * 1000)
        with self._lock:
            return sum(1 for e in self._inflight.get(f"t:{tenant_id}", {}).values() if e > now)
