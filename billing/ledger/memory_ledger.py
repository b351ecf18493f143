"""Embedded mode's budget ledger: the Lua scripts' semantics under a lock."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

from billing.ledger.base import EXHAUSTED, NEEDS_SEED, RESERVED, LedgerState


@dataclass(slots=True)
class _Account:
    spent: int | None = None
    # hold id -> (amount, lease expiry ms)
    holds: dict[str, tuple[int, int]] = field(default_factory=dict)
    prices: dict[str, str] = field(default_factory=dict)


class MemoryLedger:
    def __init__(self, *, lease_ms: int = 30_000):
        self.lease_ms = lease_ms
        self._lock = threading.Lock()
        self._accounts: dict[str, _Account] = {}

    def _account(self, account: str, now: int) -> _Account:
        state = self._accounts.setdefault(account, _Account())
        # Holds whose lease ran out: their owner died before settling them.
        for hold_id in [h for h, (_, expiry) in state.holds.items() if expiry <= now]:
            del state.holds[hold_id]
        return state

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
        now = int(time.time() * 1000)
        with self._lock:
            state = self._account(account, now)
            if price is not None:
                state.prices[price[0]] = price[1]
            if state.spent is None:
                if seed is None:
                    return LedgerState(NEEDS_SEED, 0, 0)
                state.spent = int(seed)
            held = sum(a for a, _ in state.holds.values())
            if state.spent + held >= budget or state.spent + held + amount > budget:
                return LedgerState(EXHAUSTED, state.spent, held)
            state.holds[hold_id] = (int(amount), now + self.lease_ms)
            return LedgerState(RESERVED, state.spent, held + amount)

    def settle(self, *, account: str, hold_id: str, cost: int) -> bool:
        with self._lock:
            state = self._accounts.get(account)
            if state is None or state.holds.pop(hold_id, None) is None:
                return False
            if state.spent is not None:
                state.spent += max(0, int(cost))
            return True

    def renew(self, *, account: str, hold_id: str) -> bool:
        now = int(time.time() * 1000)
        with self._lock:
            state = self._accounts.get(account)
            hold = state.holds.get(hold_id) if state is not None else None
            if hold is None or hold[1] <= now:
                return False
            state.holds[hold_id] = (hold[0], now + self.lease_ms)
            return True

    def spent(self, *, account: str) -> int | None:
        with self._lock:
            state = self._accounts.get(account)
            return None if state is None else state.spent

    def catch_up(self, *, account: str, spent: int) -> bool:
        with self._lock:
            state = self._accounts.setdefault(account, _Account())
            if state.spent is None or state.spent < spent:
                state.spent = int(spent)
                return True
            return False

    def recall_price(self, *, account: str, model: str) -> str | None:
        with self._lock:
            state = self._accounts.get(account)
            return None if state is None else state.prices.get(model)
