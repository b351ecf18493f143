"""The limiter shared by every web process: Redis state, changed by Lua scripts."""

from __future__ import annotations

import redis

from tenants.ratelimit import scripts
from tenants.ratelimit.base import WINDOW_MS, Limits, Snapshot, Ticket

# A month's counter outlives its month by a few days, then goes.
QUOTA_TTL_S = 35 * 24 * 3600
# A tenant's reservations hash, when no admission or renewal touches it.
RESERVATION_TTL_MS = 24 * 3600 * 1000


class RedisLimiter:
    """Atomic rate limits and quotas in Redis; safe for threads and processes."""

    def __init__(
        self,
        url: str,
        *,
        prefix: str = "rl",
        lease_ms: int = 30_000,
        window_ms: int = WINDOW_MS,
    ):
        # A burst waits for a pooled connection instead of failing with
        # "Too many connections"; each check holds one for one round trip.
        pool = redis.BlockingConnectionPool.from_url(url, max_connections=64, timeout=10)
        self.client = redis.Redis(connection_pool=pool)
        self.prefix = prefix
        # How long a slot outlives its owner's last renewal.
        self.lease_ms = lease_ms
        self.window_ms = window_ms
        # register_script sends EVALSHA, falling back to EVAL once per
        # process when the server has not cached the script yet.
        self._admit = self.client.register_script(scripts.ADMIT)
        self._count = self.client.register_script(scripts.COUNT)
        self._settle = self.client.register_script(scripts.SETTLE)
        self._renew = self.client.register_script(scripts.RENEW)

    def _tenant(self, ticket: Ticket) -> str:
        return f"{self.prefix}:{ticket.tenant_scope}"

    def _quota(self, ticket: Ticket) -> str:
        return f"{self.prefix}:{ticket.quota_scope}"

    def count(self, *, ticket: Ticket, limits: Limits) -> Snapshot:
        key, tenant = f"{self.prefix}:{ticket.key_scope}", self._tenant(ticket)
        raw = self._count(
            keys=[f"{key}:log", f"{key}:tok", f"{tenant}:log", f"{tenant}:tok"],
            args=[self.window_ms, limits.key_rpm, 0, limits.tenant_rpm, 0, 0, 0, 0, 0,
                  ticket.response_id],
        )  # fmt: skip
        return _snapshot(raw)

    def admit(
        self, *, ticket: Ticket, limits: Limits, tokens: int, quota_seed: int | None = None
    ) -> Snapshot:
        key, tenant = f"{self.prefix}:{ticket.key_scope}", self._tenant(ticket)
        quota = self._quota(ticket)
        raw = self._admit(
            keys=[
                f"{key}:log",
                f"{key}:tok",
                f"{tenant}:log",
                f"{tenant}:tok",
                f"{tenant}:inflight",
                f"{quota}:quota:{ticket.period}",
                f"{quota}:resv",
            ],
            args=[
                self.window_ms,
                limits.key_rpm,
                limits.key_tpm,
                limits.tenant_rpm,
                limits.tenant_tpm,
                limits.max_concurrent,
                self.lease_ms,
                limits.monthly_quota,
                int(tokens),
                ticket.response_id,
                "" if quota_seed is None else int(quota_seed),
                QUOTA_TTL_S,
                RESERVATION_TTL_MS,
                ticket.period,
            ],
        )
        return _snapshot(raw)

    def settle(self, *, ticket: Ticket, tokens: int, quota_tokens: int) -> bool:
        key, tenant = f"{self.prefix}:{ticket.key_scope}", self._tenant(ticket)
        quota = self._quota(ticket)
        done = self._settle(
            keys=[
                f"{quota}:resv",
                f"{key}:tok",
                f"{tenant}:tok",
                f"{tenant}:inflight",
                f"{quota}:quota:{ticket.period}",
            ],
            args=[ticket.response_id, max(0, int(tokens)), max(0, int(quota_tokens))],
        )
        return bool(done)

    def renew(self, *, ticket: Ticket) -> bool:
        done = self._renew(
            keys=[f"{self._tenant(ticket)}:inflight", f"{self._quota(ticket)}:resv"],
            args=[ticket.response_id, self.lease_ms, RESERVATION_TTL_MS],
        )
        return bool(done)

    def quota_used(self, *, tenant_id: int, period: str) -> int | None:
        value = self.client.get(f"{self.prefix}:t:{tenant_id}:quota:{period}")
        return None if value is None else int(value)

    def in_flight(self, *, tenant_id: int) -> int:
        """Interactive slots held now by the tenant (leases not yet expired)."""
        key = f"{self.prefix}:t:{tenant_id}:inflight"
        now_s, now_us = self.client.time()
        return self.client.zcount(key, f"({now_s * 1000 + now_us // 1000}", "+inf")


def _snapshot(raw: list) -> Snapshot:
    outcome = raw[0].decode() if isinstance(raw[0], bytes) else raw[0]
    return Snapshot(outcome, *(int(v) for v in raw[1:]))
