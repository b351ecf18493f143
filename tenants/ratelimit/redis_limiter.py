"""The limiter shared by every web process: Redis state, changed by Lua scripts."""

from __future__ import annotations

import redis

from tenants.ratelimit import scripts
from tenants.ratelimit.base import WINDOW_MS, Limits, Snapshot, Ticket

# A month's counter outlives its month by a few days, then goes.
QUOTA_TTL_S = 35 * 24 * 3600
# A reservation never settled (its web process died) is dropped after this.
RESERVATION_TTL_MS = 24 * 3600 * 1000


class RedisLimiter:
    """Atomic rate limits and quotas in Redis; safe for threads and processes."""

    def __init__(self, url: str, *, prefix: str = "rl", lease_ms: int = 900_000):
        # A burst waits for a pooled connection instead of failing with
        # "Too many connections"; each check holds one for one round trip.
        pool = redis.BlockingConnectionPool.from_url(url, max_connections=64, timeout=10)
        self.client = redis.Redis(connection_pool=pool)
        self.prefix = prefix
        # How long a concurrency slot is held at most when no settlement comes.
        self.lease_ms = lease_ms
        # register_script sends EVALSHA, falling back to EVAL once per
        # process when the server has not cached the script yet.
        self._admit = self.client.register_script(scripts.ADMIT)
        self._settle = self.client.register_script(scripts.SETTLE)

    def _keys(self, ticket: Ticket) -> tuple[str, str, str, str]:
        p = self.prefix
        tenant = ticket.tenant_scope
        return (
            f"{p}:{ticket.key_scope}",
            f"{p}:{tenant}",
            f"{p}:{tenant}:inflight",
            f"{p}:{tenant}:quota:{ticket.period}",
        )

    def _reservation(self, ticket: Ticket) -> str:
        return f"{self.prefix}:resv:{ticket.response_id}"

    def admit(
        self, *, ticket: Ticket, limits: Limits, tokens: int, quota_seed: int | None = None
    ) -> Snapshot:
        raw = self._admit(
            keys=[*self._keys(ticket), self._reservation(ticket)],
            args=[
                WINDOW_MS,
                limits.key_rpm,
                limits.key_tpm,
                limits.tenant_rpm,
                limits.tenant_tpm,
                limits.max_concurrent,
                self.lease_ms,
                limits.monthly_quota,
                tokens,
                ticket.response_id,
                "" if quota_seed is None else int(quota_seed),
                QUOTA_TTL_S,
                RESERVATION_TTL_MS,
            ],
        )
        outcome = raw[0].decode() if isinstance(raw[0], bytes) else raw[0]
        return Snapshot(outcome, *(int(v) for v in raw[1:]))

    def settle(self, *, ticket: Ticket, tokens: int, quota_tokens: int) -> bool:
        key, tenant, inflight, quota = self._keys(ticket)
        done = self._settle(
            keys=[self._reservation(ticket), key, tenant, inflight, quota],
            args=[max(0, tokens), max(0, quota_tokens), ticket.response_id],
        )
        return bool(done)

    def quota_used(self, *, tenant_id: int, period: str) -> int | None:
        value = self.client.get(f"{self.prefix}:t:{tenant_id}:quota:{period}")
        return None if value is None else int(value)

    def in_flight(self, *, tenant_id: int) -> int:
        """Slots held now by the tenant (leases not yet expired)."""
        key = f"{self.prefix}:t:{tenant_id}:inflight"
        now_s, now_us = self.client.time()
        return self.client.zcount(key, f"({now_s * 1000 + now_us // 1000}", "+inf")
