"""SchedulingPolicy "fair": tiers by weight, tenants by counter, batch last.

Three layers, each deciding only what the one above leaves open:

1. Tiers share capacity and token budget by weight (fair_share.py). Each
   step credit is refilled. A tier under its share whose next queued
   sequence does not fit *claims* room back: the scheduler preempts
   sequences of the tier most over its share, but only while that tier
   stays above the claimant relative to their shares, so capacity never
   moves back and forth. Until claimants are served, over-share tiers
   start nothing new. Decodes are served first, the tiers furthest under
   their share first; prefill chunks and admissions go by credit, a tier
   taking more than its credit only what the others' demand leaves over.
2. Inside a tier, tenants are equal: the tier's next sequence is the head
   of its tenant with the lowest virtual token counter (tenant_counters.py).
   A head that does not fit lets the tier's other tenants start only
   within ``fair_counter_slack`` of its counter (fair_queue.py). A tenant
   under its share of the tier whose head does not fit claims from the
   most-served tenant over its share, if that one was served more than
   the slack above it and holds more than ``fair_preempt_margin`` shares
   above it once the claim runs (fair_victims.py).
   Within a tenant: service class (priority, default, flex), then
   priority, then arrival.
3. Batch-class sequences start only when no interactive sequence is
   queued, take only the budget interactive work leaves, and are the
   first victims of any interactive claim or KV shortage. Among
   themselves, tenants by counter, charged at 1 / tier weight. An
   interactive arrival waits for the step in flight, and a step's time
   grows with its rows, so batch work also has a budget of its own:
   while interactive work was about in the last ``batch_yield_seconds``,
   at most ``batch_step_tokens`` batch tokens per step (decodes and
   chunks); and a step that computes an interactive prefill (a first
   token waits on it) carries no batch work at all, for at most
   ``BATCH_DEFER_MAX_STEPS`` steps in a row.

A sequence that resumed after a preemption fewer than
``preempt_min_steps`` steps ago is never taken by a claim (the progress
guarantee), so no sequence thrashes between claimants.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterable

from gpuworkers.engine.scheduling import fair_estimate, fair_victims
from gpuworkers.engine.scheduling.capacity import Capacity
from gpuworkers.engine.scheduling.fair_queue import GroupQueue
from gpuworkers.engine.scheduling.fair_share import FairShare
from gpuworkers.engine.scheduling.policy import Queues, SchedulingPolicy
from gpuworkers.engine.scheduling.tenant_counters import (
    BATCH_GROUP,
    TenantCounters,
    TenantKey,
    tenant_key,
)
from gpuworkers.engine.sequence import Sequence, SequenceStatus

# Steps in a row an interactive prefill may keep batch work out of the
# step: then batch gets its budget for one step, so an interactive prompt
# that cannot start yet (waiting for KV) never stalls the batch for long.
BATCH_DEFER_MAX_STEPS = 8


def class_key(seq: Sequence):
    """Within a tenant: higher class, then higher priority, then arrival."""
    request = seq.request
    return (request.service_class.rank, -request.priority, request.arrival_time, seq.seq_id)


class FairPolicy(SchedulingPolicy):
    name = "fair"

    def __init__(self, weights: dict[str, float], capacity: Capacity, max_num_seqs: int):
        super().__init__()
        config = capacity.config
        self.share = FairShare(weights, max_num_seqs, capacity.num_blocks)
        self.counters = TenantCounters(config.fair_prompt_weight, config.fair_output_weight)
        self.batch_counters = TenantCounters(config.fair_prompt_weight, config.fair_output_weight)
        self.margin = config.fair_preempt_margin
        self.slack = config.fair_counter_slack
        self.footprint = capacity.footprint
        # The smallest chunk a tier in debt still gets: it keeps moving.
        self.min_chunk = capacity.kv.block_size
        self.claimants: set[str] = set()
        # Active tenants per tier this step (a tenant's share is the tier's / n).
        self.num_tenants: dict[str, int] = {}
        # Each tenant's dominant usage at the step's start (tie-breaks).
        self.tenant_usage: dict[TenantKey, float] = {}
        # This step's startable interactive work per tier, and token demand per tier.
        self.pending: dict[str, GroupQueue] = {}
        self.demand: dict[str, int] = {}
        # The batch lane, built when interactive admission is over (None: not yet).
        self.batch_pending: GroupQueue | None = None
        # The batch class's budget (config.batch_step_tokens): tokens batch
        # sequences may still compute this step.
        self.batch_step_tokens = config.batch_step_tokens
        self.batch_yield_seconds = config.batch_yield_seconds
        self.batch_left = 0
        self.batch_deferred_steps = 0
        # When interactive work was last queued or running (None: never).
        self.interactive_seen: float | None = None
        self.clock = time.monotonic

    def queue_key(self, seq: Sequence):
        # Within a tenant, swapped sequences come back before new ones start.
        return (seq.status is not SequenceStatus.SWAPPED, *class_key(seq))

    def tier_label(self, seq: Sequence) -> str:
        return self.share.tier_of(seq)

    def key_of(self, seq: Sequence) -> TenantKey:
        return tenant_key(seq, self.share.tier_of(seq))

    def interactive(self, seqs: Iterable[Sequence]) -> list[Sequence]:
        return [s for s in seqs if not s.request.is_batch]

    # Claims -------------------------------------------------------------

    def begin_step(self, queues: Queues, budget: int) -> list[Sequence]:
        """Refill credit, lift newcomers' counters; the next sequence of
        each tier that may start claims room (tier claimants first, the
        tier with the most credit first)."""
        self.queues = queues
        self.batch_pending = None
        share, footprint = self.share, self.footprint
        running = self.interactive(queues.running)
        queued = queues.swapped + queues.waiting
        waiting = self.interactive(queued)
        tenants: dict[str, set[TenantKey]] = {}
        for seq in running + waiting:
            key = self.key_of(seq)
            tenants.setdefault(key[0], set()).add(key)
        share.refill(set(tenants), budget)
        self.batch_left = self._batch_budget(budget, bool(running or waiting))
        self.counters.observe(tenants)
        self.num_tenants = {tier: len(keys) for tier, keys in tenants.items()}
        batch = [s for s in queues.running + queued if s.request.is_batch]
        self.batch_counters.observe({BATCH_GROUP: {self.key_of(s) for s in batch}})
        self.tenant_usage = self.usage_by_tenant(running)
        usage = share.usage(running, footprint)
        pending = self._by_tier(waiting)
        self.claimants = {t for t in pending if share.is_under_share(t, usage)}
        # From ``pending`` (queue order of the heads), not from the set: a
        # stable sort then breaks credit ties the same way in every process.
        ordered = sorted(pending, key=share.credit_of, reverse=True)
        heads = [pending[t].head() for t in ordered if not self.claimants or t in self.claimants]
        if self.claimants:
            return heads
        # No tier claims: a tier's next sequence may still take room from
        # batch work, or from a tenant of its own tier over its share.
        movable_batch = any(s.request.is_batch and not s.preempt_guard for s in queues.running)
        return [h for h in heads if movable_batch or fair_victims.tenant_may_claim(self, h)]

    def reclaim_victim(self, claim: Sequence) -> Sequence | None:
        """A running batch sequence first; then, for a tier claimant, of the
        tier most over its share; then, for a tenant under its share of the
        tier, of the tier's most-served tenant over its share."""
        running = self.queues.running
        victim = fair_victims.batch_victim(self, running)
        if victim is None and self.share.tier_of(claim) in self.claimants:
            interactive = self.interactive(running)
            movable = [s for s in interactive if not s.preempt_guard]
            victim = fair_victims.most_over_share(self, movable, interactive, claim)
        if victim is None:
            victim = fair_victims.tenant_victim(self, claim)
        return victim

    # Serving ------------------------------------------------------------

    def serving_key(self):
        """Also fixes, once the claims have taken their room, the queued
        work that may start this step and each tier's token demand."""
        queues, share = self.queues, self.share
        running = self.interactive(queues.running)
        pending = self._by_tier(self.interactive(queues.swapped + queues.waiting))
        if self.claimants:
            pending = {t: q for t, q in pending.items() if t in self.claimants}
        self.pending = pending
        prefilling = [s for s in running if s.is_prefilling]
        queued = [s for tier in pending.values() for s in tier.sequences()]
        self.demand = _demand(share, prefilling + queued)
        levels = share.levels(running, self.footprint)

        def key(seq: Sequence):
            # Batch last: its chunks take what is left and its sequences
            # are at the end, where victims come from. Then decodes first,
            # the tiers furthest under their share first, so that
            # over-share tiers' sequences are still unscheduled when one
            # must be preempted; then prefill chunks by credit; inside a
            # tier, the least-served tenant first.
            tier = share.tier_of(seq)
            if seq.request.is_batch:
                counter = self.batch_counters.counter(BATCH_GROUP, self.key_of(seq))
                return (1, seq.is_prefilling, 0.0, 0.0, counter, class_key(seq))
            counter = self.counters.counter(tier, self.key_of(seq))
            level, credit = levels.get(tier, 0.0), share.credit_of(tier)
            return (0, seq.is_prefilling, level, -credit, counter, class_key(seq))

        return key

    def plan_running(self, running: list[Sequence], budget: int) -> dict[int, int]:
        """As the base plan (every decode before any chunk), but batch
        sequences compute only within the batch budget, and nothing in a
        step with an interactive prefill (up to BATCH_DEFER_MAX_STEPS in a
        row: then their decodes go before that prefill's chunk once)."""
        if any(d > 0 for d in self.demand.values()):
            if self.batch_deferred_steps < BATCH_DEFER_MAX_STEPS:
                self.batch_deferred_steps += 1
                self.batch_left = 0
            else:
                self.batch_deferred_steps = 0
        else:
            self.batch_deferred_steps = 0
        plan: dict[int, int] = {}
        for seq in running:
            if seq.is_prefilling or not budget:
                continue
            if seq.request.is_batch:
                if self.batch_left <= 0:
                    continue
                self.batch_left -= 1
            plan[seq.seq_id] = 1
            budget -= 1
        for seq in running:
            if budget and seq.is_prefilling:
                num_new = min(seq.num_uncomputed_tokens, budget, self.chunk_cap(seq, budget))
                if num_new > 0:
                    plan[seq.seq_id] = num_new
                    budget -= num_new
                    if seq.request.is_batch:
                        self.batch_left -= num_new
        return plan

    def pick_victim(self, unscheduled: list[Sequence]) -> Sequence:
        """Batch first; then of the tier most over its share; else the
        lowest-priority, newest. Guarded sequences only if all are."""
        movable = [s for s in unscheduled if not s.preempt_guard] or unscheduled
        batch = [s for s in movable if s.request.is_batch]
        if batch:
            return batch[-1]
        running = self.interactive(self.queues.running)
        victim = fair_victims.most_over_share(self, self.interactive(movable), running)
        return victim or max(movable, key=fair_victims.victim_rank)

    def chunk_cap(self, seq: Sequence, budget: int) -> int:
        """The tier's credit, or more when the other tiers' remaining demand
        leaves budget over (never idle while work waits). Batch: only what
        interactive demand leaves over."""
        demand = self.demand
        if seq.request.is_batch:
            left = budget - sum(max(d, 0) for d in demand.values())
            return max(0, min(left, self.batch_left))
        tier = self.share.tier_of(seq)
        demand[tier] = demand.get(tier, 0) - seq.num_uncomputed_tokens
        others = sum(d for t, d in demand.items() if t != tier)
        return max(int(self.share.credit_of(tier)), budget - others, self.min_chunk)

    # Admission ----------------------------------------------------------

    def next_to_admit(self) -> Sequence | None:
        """Interactive: the tier under its share, else the one with most
        credit; in it, the lowest counter's head. Then, only if nothing
        interactive is queued, the batch lane by counter."""
        share = self.share
        while self.pending:
            usage = share.usage(self.interactive(self.queues.running), self.footprint)
            tier = max(
                self.pending,
                key=lambda t: (usage.get(t, 0.0) < share.share_of(t), share.credit_of(t)),
            )
            head = self.pending[tier].head()
            if head is not None:
                return head
            # Every tenant left is past the bypass limit: the tier waits.
            del self.pending[tier]
        if self.batch_left <= 0:
            return None
        if self.batch_pending is None:
            self.batch_pending = self._batch_lane()
        return self.batch_pending.head()

    def admitted(self, seq: Sequence, num_tokens: int) -> None:
        """A head that does not fit ends its tenant's turn; the others of
        its tier (or lane) go on within the bypass slack."""
        key = self.key_of(seq)
        if seq.request.is_batch:
            self.batch_left -= num_tokens
            if num_tokens:
                self.batch_pending.started(key)
            else:
                self.batch_pending.blocked(key)
            return
        tier = key[0]
        queue = self.pending[tier]
        if num_tokens:
            queue.started(key)
        else:
            rest = queue.blocked(key)
            self.demand[tier] -= sum(s.num_uncomputed_tokens for s in rest)
        if not queue:
            del self.pending[tier]

    def on_scheduled(self, seq: Sequence, num_tokens: int) -> None:
        key = self.key_of(seq)
        tier = key[0]
        if seq.request.is_batch:
            # No tier credit: batch uses what the tiers left. Higher tiers'
            # batch work gets more of the leftovers.
            scale = 1.0 / self.share.weights[tier]
            self.batch_counters.charge(BATCH_GROUP, key, seq, num_tokens, scale)
            return
        self.share.charge(seq, num_tokens)
        # Drafts (spec/) come as a second call for the same positions: the
        # counter charges each position once, as it is first computed.
        self.counters.charge(tier, key, seq, num_tokens)

    def queue_positions(self, queues: Queues) -> dict[str, dict]:
        """Per tier, what is ahead of each active tenant's next request
        (fair_estimate.py)."""
        return fair_estimate.queue_positions(self, queues)

    # Helpers ------------------------------------------------------------

    def usage_by_tenant(self, running: list[Sequence]) -> dict[TenantKey, float]:
        """Each tenant's dominant fraction of the slots and KV pool."""
        slots, blocks = fair_victims.tenant_tally(self, running)
        share = self.share
        return {k: max(slots[k] / share.max_num_seqs, blocks[k] / share.num_blocks) for k in slots}

    def _batch_budget(self, budget: int, interactive_now: bool) -> int:
        """Tokens batch sequences may compute this step: the whole budget,
        or ``batch_step_tokens`` while interactive work is about."""
        now = self.clock()
        if interactive_now:
            self.interactive_seen = now
        seen = self.interactive_seen
        if self.batch_step_tokens and seen is not None and now - seen < self.batch_yield_seconds:
            return min(budget, self.batch_step_tokens)
        return budget

    def _group(self, group: str) -> GroupQueue:
        counters = self.batch_counters if group == BATCH_GROUP else self.counters
        return GroupQueue(group, counters, self.tenant_usage, self.slack, self.queue_key)

    def _by_tier(self, queued: Iterable[Sequence]) -> dict[str, GroupQueue]:
        """Queued sequences per tier, then per tenant, in queue order."""
        pending: dict[str, GroupQueue] = {}
        for seq in sorted(queued, key=self.queue_key):
            key = self.key_of(seq)
            if key[0] not in pending:
                pending[key[0]] = self._group(key[0])
            pending[key[0]].add(key, seq)
        return pending

    def _batch_lane(self) -> GroupQueue:
        """Queued batch sequences, if no interactive one is queued (batch
        only takes what interactive work leaves); else an empty lane."""
        lane = self._group(BATCH_GROUP)
        queued = self.queues.swapped + self.queues.waiting
        if all(s.request.is_batch for s in queued):
            for seq in sorted(queued, key=self.queue_key):
                lane.add(self.key_of(seq), seq)
        return lane


def _demand(share: FairShare, seqs: Iterable[Sequence]) -> dict[str, int]:
    """Tokens each tier wants computed this step."""
    wanted: Counter[str] = Counter()
    for seq in seqs:
        wanted[share.tier_of(seq)] += seq.num_uncomputed_tokens
    return dict(wanted)
