"""What both budget ledgers (Redis + Lua, in-process) share."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

RESERVED, EXHAUSTED, NEEDS_SEED = "ok", "exhausted", "seed"


@dataclass(slots=True, frozen=True)
class LedgerState:
    """A reservation's answer; amounts in nano-units of the billing currency."""

    outcome: str
    # Settled spend this month, before this reservation.
    spent: int
    # Held by responses in flight (this one included when reserved).
    held: int


class Ledger(Protocol):
    """A month's spend per tenant, and the holds of the responses in flight.

    ``account`` names one tenant and month. A reservation is atomic: the
    check (spent + held + amount within the budget) and the hold are one
    step, so concurrent admissions can never promise more than the budget.
    """

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
        """Hold ``amount`` if the budget allows it; ``price`` (model, encoded)
        is remembered for ``recall_price``."""

    def settle(self, *, account: str, hold_id: str, cost: int) -> bool:
        """Release the hold and add ``cost`` to the spend, once (False after)."""

    def renew(self, *, account: str, hold_id: str) -> bool:
        """Extend the hold's lease; False when it is gone."""

    def spent(self, *, account: str) -> int | None:
        """The settled spend; None when unknown (never seeded, or lost)."""

    def catch_up(self, *, account: str, spent: int) -> bool:
        """Raise the settled spend to ``spent`` if it is below; True if raised."""

    def recall_price(self, *, account: str, model: str) -> str | None:
        """The price last reserved at for ``model`` (encoded), if any."""
