"""SchedulingPolicy "fair": tiers share capacity and token budget by weight.

Each step: credit is refilled (fair_share.py). A tier under its share
whose next queued sequence does not fit *claims* room back: the scheduler
preempts sequences of the tier most over its share, but only while that
tier stays above the claimant relative to their shares, so capacity never
moves back and forth. Until claimants are served, over-share tiers start
nothing new. Decodes are served first, the tiers furthest under their
share first; prefill chunks and admissions go by credit, a tier taking
more than its credit only what the others' demand leaves over.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

from gpuworkers.engine.scheduling.capacity import Capacity, seats
from gpuworkers.engine.scheduling.fair_share import FairShare
from gpuworkers.engine.scheduling.policy import Queues, SchedulingPolicy, priority_key
from gpuworkers.engine.sequence import Sequence, SequenceStatus


class FairPolicy(SchedulingPolicy):
    name = "fair"

    def __init__(self, weights: dict[str, float], capacity: Capacity, max_num_seqs: int):
        super().__init__()
        self.share = FairShare(weights, max_num_seqs, capacity.num_blocks)
        self.footprint = capacity.footprint
        # The smallest chunk a tier in debt still gets: it keeps moving.
        self.min_chunk = capacity.kv.block_size
        self.claimants: set[str] = set()
        # This step's startable queued work per tier, and token demand per tier.
        self.pending: dict[str, list[Sequence]] = {}
        self.demand: dict[str, int] = {}

    def queue_key(self, seq: Sequence):
        # Within a tier, swapped sequences come back before new ones start.
        return (seq.status is not SequenceStatus.SWAPPED, priority_key(seq))

    def tier_label(self, seq: Sequence) -> str:
        return self.share.tier_of(seq)

    # Claims -------------------------------------------------------------

    def begin_step(self, queues: Queues, budget: int) -> list[Sequence]:
        """Refill credit; the heads of the under-share tiers' queues claim
        room, the tier with the most credit first."""
        self.queues = queues
        share = self.share
        active = {
            share.tier_of(s) for q in (queues.waiting, queues.running, queues.swapped) for s in q
        }
        share.refill(active, budget)
        usage = share.usage(queues.running, self.footprint)
        pending = self._by_tier(queues.swapped + queues.waiting)
        self.claimants = {t for t in pending if share.is_under_share(t, usage)}
        # From ``pending`` (queue order of the heads), not from the set: a
        # stable sort then breaks credit ties the same way in every process.
        ordered = sorted(
            (t for t in pending if t in self.claimants), key=share.credit_of, reverse=True
        )
        return [pending[tier][0] for tier in ordered]

    def reclaim_victim(self, claim: Sequence) -> Sequence | None:
        running = self.queues.running
        return self._most_over_share(running, running, claim)

    # Serving ------------------------------------------------------------

    def serving_key(self):
        """Also fixes, once the claims have taken their room, the queued
        work that may start this step and each tier's token demand."""
        queues, share = self.queues, self.share
        self.pending = self._by_tier(queues.swapped + queues.waiting, self.claimants)
        prefilling = [s for s in queues.running if s.is_prefilling]
        queued = [s for q in self.pending.values() for s in q]
        self.demand = _demand(share, prefilling + queued)
        levels = share.levels(queues.running, self.footprint)

        def key(seq: Sequence):
            # Decodes first, the tiers furthest under their share first, so
            # that over-share tiers' sequences are still unscheduled when
            # one must be preempted; then prefill chunks by credit.
            tier = share.tier_of(seq)
            return (
                seq.is_prefilling,
                levels.get(tier, 0.0),
                -share.credit_of(tier),
                priority_key(seq),
            )

        return key

    def pick_victim(self, unscheduled: list[Sequence]) -> Sequence:
        """Of the tier most over its share; else the lowest-priority, newest."""
        victim = self._most_over_share(unscheduled, self.queues.running)
        return victim or max(unscheduled, key=priority_key)

    def chunk_cap(self, seq: Sequence, budget: int) -> int:
        """The tier's credit, or more when the other tiers' remaining demand
        leaves budget over (never idle while work waits)."""
        tier = self.share.tier_of(seq)
        demand = self.demand
        demand[tier] = demand.get(tier, 0) - seq.num_uncomputed_tokens
        others = sum(d for t, d in demand.items() if t != tier)
        return max(int(self.share.credit_of(tier)), budget - others, self.min_chunk)

    # Admission ----------------------------------------------------------

    def next_to_admit(self) -> Sequence | None:
        """Head of the tier under its share, else of the one with most credit."""
        if not self.pending:
            return None
        share = self.share
        usage = share.usage(self.queues.running, self.footprint)
        tier = max(
            self.pending,
            key=lambda t: (usage.get(t, 0.0) < share.share_of(t), share.credit_of(t)),
        )
        return self.pending[tier][0]

    def admitted(self, seq: Sequence, num_tokens: int) -> None:
        """Strict order within a tier: a head that does not fit ends its tier's turn."""
        tier = self.share.tier_of(seq)
        if not num_tokens:
            del self.pending[tier]
            self.demand[tier] = 0
            return
        self.pending[tier].pop(0)
        if not self.pending[tier]:
            del self.pending[tier]

    def on_scheduled(self, seq: Sequence, num_tokens: int) -> None:
        self.share.charge(seq, num_tokens)

    # Helpers ------------------------------------------------------------

    def _by_tier(self, queued: Iterable[Sequence], only: set[str] | None = None):
        """Queued sequences per tier in queue order (all tiers if ``only`` is empty)."""
        pending: dict[str, list[Sequence]] = {}
        for seq in sorted(queued, key=self.queue_key):
            tier = self.share.tier_of(seq)
            if not only or tier in only:
                pending.setdefault(tier, []).append(seq)
        return pending

    def _most_over_share(
        self, candidates: Iterable[Sequence], running: list[Sequence], claim: Sequence | None = None
    ) -> Sequence | None:
        """The newest, lowest-priority candidate of the tier most over its share.

        For a ``claim`` a sequence is taken only if its tier stays above the
        claimant's, both relative to their shares, once the claim runs: a
        tier is never pushed below the one that claimed from it.
        """
        share, footprint = self.share, self.footprint
        slots, blocks = share.tally(running, footprint)
        claimant = share.tier_of(claim) if claim is not None else None
        claim_level = 0.0
        if claim is not None:
            claim_level = share.level(
                claimant, slots[claimant] + seats(claim), blocks[claimant] + footprint(claim)
            )
        best, best_key = None, None
        for seq in candidates:
            tier = share.tier_of(seq)
            level = share.level(tier, slots[tier], blocks[tier])
            if tier == claimant or level <= 1.0:
                continue
            if claim is not None:
                after = share.level(tier, slots[tier] - seats(seq), blocks[tier] - footprint(seq))
                if after <= claim_level:
                    continue
            key = (level, -seq.request.priority, seq.request.arrival_time, seq.seq_id)
            if best_key is None or key > best_key:
                best, best_key = seq, key
        return best


def _demand(share: FairShare, seqs: Iterable[Sequence]) -> dict[str, int]:
    """Tokens each tier wants computed this step."""
    wanted: Counter[str] = Counter()
    for seq in seqs:
        wanted[share.tier_of(seq)] += seq.num_uncomputed_tokens
    return dict(wanted)
