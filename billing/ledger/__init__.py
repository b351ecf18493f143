"""The budget ledger: each tenant's spend this month and the holds in flight.

Admission reserves a response's worst-case cost (``Ledger.reserve``: one
atomic check-and-hold), the response's lease is renewed while it lives,
and its end settles the hold to what it is billed. With REDIS_URL every
web process shares one ledger (RedisLedger); embedded mode keeps it in the
process (MemoryLedger). PostgreSQL stays the source of truth for settled
spend: a missing account is seeded from the usage records, and the
periodic budget check raises one that fell behind.
"""

from __future__ import annotations

import threading

from django.conf import settings

from billing.ledger.base import EXHAUSTED, NEEDS_SEED, RESERVED, Ledger, LedgerState
from billing.ledger.memory_ledger import MemoryLedger
from billing.ledger.redis_ledger import RedisLedger
from tenants.ratelimit import lease_seconds

__all__ = [
    "EXHAUSTED",
    "NEEDS_SEED",
    "RESERVED",
    "Ledger",
    "LedgerState",
    "get_ledger",
    "reset_ledgers",
]

_ledgers: dict[tuple, Ledger] = {}
_lock = threading.Lock()


def get_ledger() -> Ledger:
    """The ledger for the current settings (one per Redis URL and prefix)."""
    url = settings.REDIS_URL
    prefix = getattr(settings, "RATE_LIMIT_PREFIX", "rl")
    lease_ms = int(lease_seconds() * 1000)
    key = (url, prefix, lease_ms)
    with _lock:
        ledger = _ledgers.get(key)
        if ledger is None:
            ledger = _ledgers[key] = (
                RedisLedger(url, prefix=prefix, lease_ms=lease_ms)
                if url
                else MemoryLedger(lease_ms=lease_ms)
            )
        return ledger


def reset_ledgers() -> None:
    """Forget every ledger and its in-process state (tests)."""
    with _lock:
        _ledgers.clear()
