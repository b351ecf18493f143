"""Weighted fair share between tiers, for SchedulingPolicy.FAIR.

Two things are shared. Running capacity: a tier's usage is the larger of
its fraction of the running slots and its fraction of the KV pool, so a few
long sequences count as much as many short ones. And the per-step token
budget, with deficits: each step every tier with work earns its share of
the budget as credit and pays one credit per token scheduled; the tier with
the most credit is served first.

Shares are the weights normalised over the tiers that have work right now:
an idle tier's share is lent to the others, and it is reclaimed (by
preemption, in the scheduler) as soon as that tier queues a request.
Credit is bounded to one step's budget either way, so neither an idle
stretch nor a burst buys a tier more than one step's worth.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from gpuworkers.engine.config import DEFAULT_TIER_WEIGHTS, AdmissionPolicy
from gpuworkers.engine.sequence import Sequence, SequenceStatus

if TYPE_CHECKING:
    from gpuworkers.engine.scheduler import SchedulerOutput


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
        tier = seq.request.tier
        return tier if tier in self.weights else self.default_tier

    # Credit -------------------------------------------------------------

    def refill(self, active: set[str], budget: int) -> None:
        """Start a step: shares over the tiers with work, credit topped up."""
        total = sum(self.weights[t] for t in active) or 1.0
        self.shares = {t: self.weights[t] / total for t in active}
        self.limit = float(budget)
        # An idle tier keeps neither credit nor debt.
        self.credit = {t: c for t, c in self.credit.items() if t in active}
        for tier in active:
            earned = self.credit.get(tier, 0.0) + self.shares[tier] * budget
            self.credit[tier] = min(earned, self.limit)

    def charge(self, seq: Sequence, num_tokens: int) -> None:
        tier = self.tier_of(seq)
        self.tokens[tier] += num_tokens
        self.credit[tier] = max(self.credit.get(tier, 0.0) - num_tokens, -self.limit)

    def credit_of(self, tier: str) -> float:
        return self.credit.get(tier, 0.0)

    # Capacity -----------------------------------------------------------

    def _tally(self, running: Iterable[Sequence], blocks_of: Callable[[Sequence], int]):
        slots: Counter[str] = Counter()
        blocks: Counter[str] = Counter()
        for seq in running:
            tier = self.tier_of(seq)
            slots[tier] += 1
            blocks[tier] += blocks_of(seq)
        return slots, blocks

    def _level(self, tier: str, slots: int, blocks: int) -> float:
        """Dominant usage over share: 1.0 is exactly the tier's share."""
        used = max(slots / self.max_num_seqs, blocks / self.num_blocks)
        share = self.shares.get(tier, 0.0)
        return used / share if share else float("inf")

    def usage(
        self, running: Iterable[Sequence], blocks_of: Callable[[Sequence], int]
    ) -> dict[str, float]:
        """Each tier's dominant fraction of slots and KV blocks."""
        slots, blocks = self._tally(running, blocks_of)
        return {t: max(slots[t] / self.max_num_seqs, blocks[t] / self.num_blocks) for t in slots}

    def levels(
        self, running: Iterable[Sequence], blocks_of: Callable[[Sequence], int]
    ) -> dict[str, float]:
        """Each running tier's usage over its share (1.0: exactly its share)."""
        slots, blocks = self._tally(running, blocks_of)
        return {t: self._level(t, slots[t], blocks[t]) for t in slots}

    def is_under_share(self, tier: str, usage: dict[str, float]) -> bool:
        return usage.get(tier, 0.0) < self.shares.get(tier, 0.0)

    def pick_victim(
        self,
        candidates: Iterable[Sequence],
        running: list[Sequence],
        blocks_of: Callable[[Sequence], int],
        claim: Sequence | None = None,
    ) -> Sequence | None:
        """The newest, lowest-priority sequence of the tier most over its share.

        For a ``claim`` (the next queued sequence of an under-share tier) a
        sequence is taken only if its tier stays above the claimant's, both
        relative to their shares, once the claim runs: capacity moves
        towards the shares, never back and forth, and a tier is never
        pushed below the one that claimed from it.
        """
        slots, blocks = self._tally(running, blocks_of)
        claimant = self.tier_of(claim) if claim is not None else None
        claim_level = 0.0
        if claim is not None:
            claim_level = self._level(
                claimant, slots[claimant] + 1, blocks[claimant] + blocks_of(claim)
            )
        best, best_key = None, None
        for seq in candidates:
            tier = self.tier_of(seq)
            level = self._level(tier, slots[tier], blocks[tier])
            if tier == claimant or level <= 1.0:
                continue
            if claim is not None:
                after = self._level(tier, slots[tier] - 1, blocks[tier] - blocks_of(seq))
                if after <= claim_level:
                    continue
            request = seq.request
            key = (level, -request.priority, request.arrival_time, seq.seq_id)
            if best_key is None or key > best_key:
                best, best_key = seq, key
        return best

    # Token budget -------------------------------------------------------

    def pending_by_tier(
        self, queued: Iterable[Sequence], order_key, only: set[str] | None = None
    ) -> dict[str, list[Sequence]]:
        """Queued sequences per tier, in ``order_key`` order within a tier."""
        pending: dict[str, list[Sequence]] = {}
        for seq in sorted(queued, key=order_key):
            tier = self.tier_of(seq)
            if not only or tier in only:
                pending.setdefault(tier, []).append(seq)
        return pending

    def demand(self, seqs: Iterable[Sequence]) -> dict[str, int]:
        """Tokens each tier wants computed this step."""
        wanted: Counter[str] = Counter()
        for seq in seqs:
            wanted[self.tier_of(seq)] += seq.num_uncomputed_tokens
        return dict(wanted)

    def cap(self, seq: Sequence, budget: int, demand: dict[str, int], floor: int) -> int:
        """Tokens ``seq`` may take now: its tier's credit, or more when the
        other tiers' remaining demand leaves budget over (never idle while
        work waits). ``floor`` keeps a tier in debt moving."""
        tier = self.tier_of(seq)
        demand[tier] = demand.get(tier, 0) - seq.num_uncomputed_tokens
        others = sum(d for t, d in demand.items() if t != tier)
        return max(int(self.credit_of(tier)), budget - others, floor)


class FairSchedulingMixin:
    """The Scheduler's SchedulingPolicy.FAIR steps (``self`` is the Scheduler)."""

    def _blocks_held(self, seq: Sequence) -> int:
        """KV a sequence holds or, queued, will hold, for fair share (its
        whole reservation under RESERVE)."""
        if self.config.admission_policy is AdmissionPolicy.RESERVE:
            params = seq.request.params
            final = min(seq.num_prompt_tokens + params.max_tokens, self.max_model_len)
            return self.kv.blocks_for(final)
        return max(len(seq.block_table), self.kv.blocks_for(seq.num_tokens))

    def _fair_plan(self, out: SchedulerOutput, budget: int):
        """Refill credit; reclaim lent capacity for under-share tiers.

        A tier under its share whose next queued sequence does not fit takes
        room back from the tiers over theirs, by preemption. Until such
        claimants are served, over-share tiers admit nothing new. Returns
        the queued work per tier that may start this step and each tier's
        token demand.
        """
        fair = self.fair
        queues = (self.waiting, self.running, self.swapped)
        fair.refill({fair.tier_of(s) for queue in queues for s in queue}, budget)
        queued = self.swapped + self.waiting
        usage = fair.usage(self.running, self._blocks_held)
        pending = fair.pending_by_tier(queued, self._queued_key)
        claimants = {t for t in pending if fair.is_under_share(t, usage)}
        for tier in sorted(claimants, key=fair.credit_of, reverse=True):
            head = pending[tier][0]
            while not self._fits_now(head):
                victim = fair.pick_victim(self.running, self.running, self._blocks_held, head)
                if victim is None:
                    break
                self._preempt(victim, out)
        pending = fair.pending_by_tier(self.swapped + self.waiting, self._queued_key, claimants)
        prefilling = [s for s in self.running if s.is_prefilling]
        return pending, fair.demand(prefilling + [s for q in pending.values() for s in q])

    def _queued_key(self, seq: Sequence):
        # Within a tier, swapped sequences come back before new ones start.
        return (seq.status is not SequenceStatus.SWAPPED, self._order_key(seq))

    def _fits_now(self, seq: Sequence) -> bool:
        budget = self.config.max_num_batched_tokens
        if seq.status is SequenceStatus.SWAPPED:
            return self._swap_in_fits(seq, min(seq.num_uncomputed_tokens, budget))
        return self._admit_plan(seq, budget) is not None

    def _fair_cap(self, seq: Sequence, budget: int, demand: dict[str, int]) -> int:
        return self.fair.cap(seq, budget, demand, self.kv.block_size)

    def _fair_admit(self, out: SchedulerOutput, budget: int, pending, demand) -> None:
        """Swap-ins and admissions: tiers under their share first, then by
        credit; strict order within a tier, as in _admit."""
        while budget > 0 and pending:
            usage = self.fair.usage(self.running, self._blocks_held)
            tier = max(
                pending,
                key=lambda t: (usage.get(t, 0.0) < self.fair.shares[t], self.fair.credit_of(t)),
            )
            seq = pending[tier][0]
            limit = min(budget, self._fair_cap(seq, budget, demand))
            if seq.status is SequenceStatus.SWAPPED:
                num_new = min(seq.num_uncomputed_tokens, limit)
                plan = (None, num_new) if self._swap_in_fits(seq, num_new) else None
                if plan:
                    self._start_swapped(out, seq, num_new)
            else:
                plan = self._admit_plan(seq, limit)
                if plan:
                    self._start_waiting(out, seq, *plan)
            if plan is None:
                del pending[tier]
                demand[tier] = 0
                continue
            pending[tier].pop(0)
            if not pending[tier]:
                del pending[tier]
            budget -= plan[1]
