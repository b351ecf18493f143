"""The budget ledger shared by every web process: Redis, changed by Lua scripts."""

from __future__ import annotations

import redis

from billing.ledger import scripts
from billing.ledger.base import LedgerState

# Longer than any month, so an account outlives the month it counts.
ACCOUNT_TTL_S = 40 * 24 * 3600


class RedisLedger:
    def __init__(self, url: str, *, prefix: str = "rl", lease_ms: int = 30_000):
        pool = redis.BlockingConnectionPool.from_url(url, max_connections=64, timeout=10)
        self.client = redis.Redis(connection_pool=pool)
        self.prefix = prefix
        self.lease_ms = lease_ms
        self._reserve = self.client.register_script(scripts.RESERVE)
        self._settle = self.client.register_script(scripts.SETTLE)
        self._renew = self.client.register_script(scripts.RENEW)
        self._catch_up = self.client.register_script(scripts.CATCH_UP)

    def _keys(self, account: str) -> list[str]:
        # Under the rate limits' prefix: the web's Redis user owns rl:*.
        return [f"{self.prefix}:b:{account}", f"{self.prefix}:b:{account}:holds"]

    def reserve(
        self,
        *,
        account: str,
        hold_id: str,
        amount: int,
        budget: int,
        seed: int | None = None,
        price: tuple[str, str] | None = None,
    ) -> LedgerState:
        field, encoded = (f"p:{price[0]}", price[1]) if price is not None else ("", "")
        raw = self._reserve(
            keys=self._keys(account),
            args=[
                int(budget),
                int(amount),
                hold_id,
                self.lease_ms,
                "" if seed is None else int(seed),
                ACCOUNT_TTL_S,
                field,
                encoded,
            ],
        )
        outcome = raw[0].decode() if isinstance(raw[0], bytes) else raw[0]
        return LedgerState(outcome, int(raw[1]), int(raw[2]))

    def settle(self, *, account: str, hold_id: str, cost: int) -> bool:
        return bool(self._settle(keys=self._keys(account), args=[hold_id, max(0, int(cost))]))

    def renew(self, *, account: str, hold_id: str) -> bool:
        holds = self._keys(account)[1]
        return bool(self._renew(keys=[holds], args=[hold_id, self.lease_ms]))

    def spent(self, *, account: str) -> int | None:
        value = self.client.hget(self._keys(account)[0], "spent")
        return None if value is None else int(value)

    def catch_up(self, *, account: str, spent: int) -> bool:
        keys = self._keys(account)[:1]
        return bool(self._catch_up(keys=keys, args=[int(spent), ACCOUNT_TTL_S]))

    def recall_price(self, *, account: str, model: str) -> str | None:
        value = self.client.hget(self._keys(account)[0], f"p:{model}")
        return None if value is None else value.decode()
