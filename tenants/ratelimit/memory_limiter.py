"""Embedded mode's limiter: the Lua scripts' semantics, in-process, under a lock.

One web process is the whole deployment in embedded mode, so a lock gives
the same atomicity Redis gives the shared limiter. State and outcomes
mirror tenants.ratelimit.scripts step for step.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

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
class _Window:
    start: int = 0
    requests: int = 0
    tokens: int = 0


@dataclass(slots=True, frozen=True)
class _Reservation:
    tokens: int
    key_window: int
    tenant_window: int


class MemoryLimiter:
    """Thread-safe in-process rate limits and quotas."""

    def __init__(self, *, lease_ms: int = 900_000):
        self.lease_ms = lease_ms
        self._lock = threading.Lock()
        self._windows: dict[str, _Window] = {}
        # tenant scope -> {response id: lease expiry ms}
        self._inflight: dict[str, dict[str, int]] = {}
        self._quota: dict[tuple[str, str], int] = {}
        self._reservations: dict[str, _Reservation] = {}

    def _window(self, scope: str, now: int) -> _Window:
        window = self._windows.get(scope)
        if window is None or now >= window.start + WINDOW_MS:
            window = _Window(start=now)
        return window

    def admit(
        self, *, ticket: Ticket, limits: Limits, tokens: int, quota_seed: int | None = None
    ) -> Snapshot:
        now = int(time.time() * 1000)
        with self._lock:
            key = self._window(ticket.key_scope, now)
            tenant = self._window(ticket.tenant_scope, now)
            quota_key = (ticket.tenant_scope, ticket.period)
            outcome = ADMITTED
            if quota_key not in self._quota and quota_seed is not None:
                self._quota[quota_key] = int(quota_seed)
            inflight = self._inflight.setdefault(ticket.tenant_scope, {})
            for rid in [rid for rid, expiry in inflight.items() if expiry <= now]:
                del inflight[rid]
            if quota_key not in self._quota:
                outcome = NEEDS_SEED
            elif self._quota[quota_key] + tokens > limits.monthly_quota:
                outcome = QUOTA
            elif key.requests + 1 > limits.key_rpm or tenant.requests + 1 > limits.tenant_rpm:
                outcome = REQUESTS
            elif key.tokens + tokens > limits.key_tpm or tenant.tokens + tokens > limits.tenant_tpm:
                outcome = TOKENS
            elif len(inflight) >= limits.max_concurrent:
                outcome = CONCURRENCY
            else:
                for window, scope in ((key, ticket.key_scope), (tenant, ticket.tenant_scope)):
                    window.requests += 1
                    window.tokens += tokens
                    self._windows[scope] = window
                inflight[ticket.response_id] = now + self.lease_ms
                self._quota[quota_key] += tokens
                self._reservations[ticket.response_id] = _Reservation(
                    tokens, key.start, tenant.start
                )
            return Snapshot(
                outcome,
                now,
                key.start,
                key.requests,
                key.tokens,
                tenant.start,
                tenant.requests,
                tenant.tokens,
            )

    def settle(self, *, ticket: Ticket, tokens: int, quota_tokens: int) -> bool:
        with self._lock:
            self._inflight.get(ticket.tenant_scope, {}).pop(ticket.response_id, None)
            reservation = self._reservations.pop(ticket.response_id, None)
            if reservation is None:
                return False
            delta = max(0, tokens) - reservation.tokens
            for scope, start in (
                (ticket.key_scope, reservation.key_window),
                (ticket.tenant_scope, reservation.tenant_window),
            ):
                window = self._windows.get(scope)
                # Only the window the tokens were reserved in is corrected.
                if window is not None and window.start == start:
                    window.tokens = max(0, window.tokens + delta)
            quota_key = (ticket.tenant_scope, ticket.period)
            if quota_key in self._quota:
                used = self._quota[quota_key] + max(0, quota_tokens) - reservation.tokens
                self._quota[quota_key] = max(0, used)
            return True

    def quota_used(self, *, tenant_id: int, period: str) -> int | None:
        with self._lock:
            return self._quota.get((f"t:{tenant_id}", period))

    def in_flight(self, *, tenant_id: int) -> int:
        now = int(time.time() * 1000)
        with self._lock:
            return sum(1 for e in self._inflight.get(f"t:{tenant_id}", {}).values() if e > now)
