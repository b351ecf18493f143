"""Weighted fair share between tiers: the accounting behind FairPolicy.

Two things are shared. Running capacity: a tier's usage is the larger of
its fraction of the running slots and its fraction of the KV pool, so a few
long sequences count as much as many short ones. And the per-step token
budget, with deficits: each step every tier with work earns its share of
the budget as credit and pays one credit per token scheduled.

Shares are the weights normalised over the tiers that have work right now:
an idle tier's share is lent to the others (and reclaimed by the policy as
soon as that tier queues a request). Credit is bounded to one step's
budget either way, so neither an idle stretch nor a burst buys a tier more
than one step's worth.

Plain bookkeeping: no queue, no choice. Footprints (blocks per sequence)
come from the caller.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable

from gpuworkers.engine.config import DEFAULT_TIER_WEIGHTS
from gpuworkers.engine.scheduling.capacity import seats
from gpuworkers.engine.sequence import Sequence

Footprint = Callable[[Sequence], int]


class FairShare:
    def __init__(self, weights: dict[str, float], max_num_seqs: int, num_blocks: int):
        positive = {tier: w for tier, w in (weights or {}).items() if w > 0}
        self.weights = positive or dict(DEFAULT_TIER_WEIGHTS)
        # Unknown or missing tiers get the smallest share: an unlabeled
        # request must not outrank a paying one.
        self.default_tier = min(self.weights, key=self.weights.__getitem__)
        self.max_num_seqs = max_num_seqs
        self.num_blocks = max(num_blocks, 1)
        self.credit: dict[str, float] = {}
        self.shares: dict[str, float] = {}
        self.limit = 0.0
        # Tokens scheduled per tier since start (stats and tests).
        self.tokens: Counter[str] = Counter()

    def tier_of(self, seq: Sequence) -> str:
        """The tier ``seq`` is accounted under (unknown tiers: the lowest)."""
        tier = seq.request.tier
        return tier if tier in self.weights else self.default_tier

    # Credit -------------------------------------------------------------

    def refill(self, active: set[str], budget: int) -> None:
        """Start a step: shares over the tiers with work, credit topped up."""
        # Sorted: a set's order follows PYTHONHASHSEED, and the float sum
        # (hence every share comparison) must not.
        tiers = sorted(active)
        total = sum(self.weights[t] for t in tiers) or 1.0
        self.shares = {t: self.weights[t] / total for t in tiers}
        self.limit = float(budget)
        # An idle tier keeps neither credit nor debt.
        self.credit = {t: c for t, c in self.credit.items() if t in active}
        for tier in tiers:
            earned = self.credit.get(tier, 0.0) + self.shares[tier] * budget
            self.credit[tier] = min(earned, self.limit)

    def charge(self, seq: Sequence, num_tokens: int) -> None:
        """``seq``'s tier pays for ``num_tokens`` scheduled tokens."""
        tier = self.tier_of(seq)
        self.tokens[tier] += num_tokens
        self.credit[tier] = max(self.credit.get(tier, 0.0) - num_tokens, -self.limit)

    def credit_of(self, tier: str) -> float:
        return self.credit.get(tier, 0.0)

    def share_of(self, tier: str) -> float:
        """The tier's share this step (0.0 for a tier without work)."""
        return self.shares.get(tier, 0.0)

    # Capacity -----------------------------------------------------------

    def tally(self, running: Iterable[Sequence], footprint: Footprint):
        """(slots, blocks) per tier of ``running``, as two Counters; an
        n-choice prompt not yet forked holds n slots."""
        slots: Counter[str] = Counter()
        blocks: Counter[str] = Counter()
        for seq in running:
            tier = self.tier_of(seq)
            slots[tier] += seats(seq)
            blocks[tier] += footprint(seq)
        return slots, blocks

    def level(self, tier: str, slots: int, blocks: int) -> float:
        """Dominant usage over share: 1.0 is exactly the tier's share."""
        used = max(slots / self.max_num_seqs, blocks / self.num_blocks)
        share = self.shares.get(tier, 0.0)
        return used / share if share else float("inf")

    def usage(self, running: Iterable[Sequence], footprint: Footprint) -> dict[str, float]:
        """Each running tier's dominant fraction of slots and KV blocks."""
        slots, blocks = self.tally(running, footprint)
        return {t: max(slots[t] / self.max_num_seqs, blocks[t] / self.num_blocks) for t in slots}

    def levels(self, running: Iterable[Sequence], footprint: Footprint) -> dict[str, float]:
        """Each running tier's usage over its share (1.0: exactly its share)."""
        slots, blocks = self.tally(running, footprint)
        return {t: self.level(t, slots[t], blocks[t]) for t in slots}

    def is_under_share(self, tier: str, usage: dict[str, float]) -> bool:
        return usage.get(tier, 0.0) < self.shares.get(tier, 0.0)
