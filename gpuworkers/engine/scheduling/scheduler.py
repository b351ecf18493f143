"""Iteration-level continuous batching with a token budget per step.

Each step: running sequences first (every decode its token, then a chunk
per prefill), then swapped-out sequences back in, then new admissions, until
the token budget or the sequence cap runs out (an n-choice request counts n
sequences from its start). When a running sequence cannot
grow, one is preempted: swapped to the host pool if it fits there,
recomputed later otherwise. Which one, and every other choice of order,
is the SchedulingPolicy's (policy.py); this module does the acting and
hands the runner a plain ScheduledBatch (batch.py).
"""

from __future__ import annotations

import time

from gpuworkers.engine.config import EngineConfig, SchedulingPolicyName
from gpuworkers.engine.kv_manager import KVCacheManager
from gpuworkers.engine.scheduling.batch import (
    CacheOps,
    ScheduledBatch,
    ScheduledSeq,
    assemble,
    snapshot,
)
from gpuworkers.engine.scheduling.capacity import Capacity
from gpuworkers.engine.scheduling.fair_policy import FairPolicy
from gpuworkers.engine.scheduling.policy import (
    FCFSPolicy,
    PriorityPolicy,
    Queues,
    SchedulingPolicy,
)
from gpuworkers.engine.sequence import Sequence, SequenceStatus
from gpuworkers.engine.spec import Speculator, num_accepted


def make_policy(config: EngineConfig, capacity: Capacity) -> SchedulingPolicy:
    """The policy named by ``config.scheduling_policy``."""
    if config.scheduling_policy is SchedulingPolicyName.FAIR:
        return FairPolicy(config.tier_weights, capacity, config.max_num_seqs)
    if config.scheduling_policy is SchedulingPolicyName.FCFS:
        return FCFSPolicy()
    return PriorityPolicy()


class Scheduler:
    """Plans each step (``schedule``) and finishes it (``on_step_done``)
    with the runner's sampled tokens; owns the queues and the sequences'
    KV bookkeeping through the KV manager."""

    def __init__(self, config: EngineConfig, kv: KVCacheManager, max_model_len: int):
        self.config = config
        self.kv = kv
        self.max_model_len = max_model_len
        self.capacity = Capacity(config, kv, max_model_len)
        self.policy = make_policy(config, self.capacity)
        self.queues = Queues()
        self.speculator = Speculator(config)
        # Every sequence the scheduler may still schedule, by id: the batch
        # names sequences by id only.
        self.seqs: dict[int, Sequence] = {}
        self.num_preemptions = 0
        self.num_swaps_out = 0
        self.num_swaps_in = 0
        self.num_recomputes = 0

    @property
    def waiting(self) -> list[Sequence]:
        return self.queues.waiting

    @property
    def running(self) -> list[Sequence]:
        return self.queues.running

    @property
    def swapped(self) -> list[Sequence]:
        return self.queues.swapped

    # Queues -----------------------------------------------------------

    def add(self, seq: Sequence) -> None:
        """Queue a request's first sequence (its siblings fork off it later)."""
        self.seqs[seq.seq_id] = seq
        self.waiting.append(seq)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running or self.swapped)

    def remove(self, seq: Sequence) -> None:
        """Take ``seq`` out of whichever queue holds it and free its KV."""
        for queue in (self.waiting, self.running, self.swapped):
            if seq in queue:
                queue.remove(seq)
        self.seqs.pop(seq.seq_id, None)
        self.kv.free(seq)

    def queued_by_tier(self) -> dict[str, dict[str, int]]:
        """Waiting and swapped interactive sequences and their tokens to
        compute, per tier: what admission control needs to estimate a
        tier's wait (batch work is never ahead of it; ``queued_by_class``
        counts it)."""
        queued: dict[str, dict[str, int]] = {}
        for seq in self.waiting + self.swapped:
            if not seq.request.is_batch:
                _count(queued.setdefault(self.policy.tier_label(seq), _entry()), seq)
        return queued

    def fair_queue(self) -> dict[str, dict]:
        """The policy's ``queue_positions`` over the current queues."""
        return self.policy.queue_positions(self.queues)

    def queued_by_class(self) -> dict[str, dict[str, dict[str, int]]]:
        """As ``queued_by_tier``, split by service class (batch included)."""
        queued: dict[str, dict[str, dict[str, int]]] = {}
        for seq in self.waiting + self.swapped:
            tier = queued.setdefault(self.policy.tier_label(seq), {})
            _count(tier.setdefault(seq.request.service_class.value, _entry()), seq)
        return queued

    # The step -----------------------------------------------------------

    def schedule(self) -> ScheduledBatch:
        """Plan one step: which sequences compute how many tokens, and the
        cache operations that must run first (see policy.py for the order
        of the policy's decisions)."""
        budget = self.config.max_num_batched_tokens
        ops = CacheOps()
        picked: list[tuple[ScheduledSeq, Sequence]] = []
        for seq in self.running:
            if seq.preempt_guard:
                seq.preempt_guard -= 1
        for claim in self.policy.begin_step(self.queues, budget):
            self._reclaim(claim, ops)
        self.running.sort(key=self.policy.serving_key())
        budget, preempted = self._serve_running(picked, ops, budget)
        if not preempted:
            # Drafts only take what is left: never budget or blocks that
            # running work or admissions wanted (and none under pressure).
            budget = self._start_queued(picked, ops, budget)
            self._add_drafts(picked, budget)
        return self._batch(picked, ops)

    def _reclaim(self, claim: Sequence, ops: CacheOps) -> None:
        """Preempt the policy's victims until ``claim`` fits (or none is left)."""
        while not self._fits_now(claim):
            victim = self.policy.reclaim_victim(claim)
            if victim is None:
                return
            self._preempt(victim, ops)

    def _fits_now(self, seq: Sequence) -> bool:
        budget = self.config.max_num_batched_tokens
        if seq.status is SequenceStatus.SWAPPED:
            num_new = min(seq.num_uncomputed_tokens, budget)
            return self.capacity.swap_in_fits(seq, num_new, self.running)
        return self._admit_plan(seq, budget) is not None

    def _serve_running(self, picked, ops: CacheOps, budget: int) -> tuple[int, bool]:
        """Decodes and prefill chunks of the running sequences; returns the
        budget left and whether anything was preempted.

        Tokens are planned decodes first (``policy.plan_running``), blocks
        given in serving order, so victims still come from that order's end."""
        queue = list(self.running)
        plan = self.policy.plan_running(queue, budget)
        preempted = False
        i = 0
        while i < len(queue):
            seq = queue[i]
            num_new = plan.get(seq.seq_id, 0)
            # Not planned (budget spent): it waits, but may still be a victim.
            while num_new and not self.kv.can_append(seq, num_new):
                victim = self.policy.pick_victim(queue[i:])
                queue.remove(victim)
                self._preempt(victim, ops)
                preempted = True
                if victim is seq:
                    break
            else:
                if num_new:
                    self._schedule(seq, num_new, picked, ops)
                    budget -= num_new
                i += 1
        return budget, preempted

    def _start_queued(self, picked, ops: CacheOps, budget: int) -> int:
        """Swap-ins and admissions, in the policy's order, within the
        budget; returns the budget left."""
        while budget > 0:
            seq = self.policy.next_to_admit()
            if seq is None:
                break
            limit = min(budget, self.policy.chunk_cap(seq, budget))
            # No budget for it (batch behind interactive demand): not now.
            num_new = self._start(seq, limit, picked, ops) if limit > 0 else 0
            self.policy.admitted(seq, num_new)
            budget -= num_new
        return budget

    def _add_drafts(self, picked, budget: int) -> None:
        """Turn decodes into verifications of n-gram drafts (engine/spec/),
        those the speculator finds worth their rows, within ``budget`` and
        the free blocks."""
        decodes = [i for i, (item, _) in enumerate(picked) if item.num_new_tokens == 1]
        if budget < 1 or not self.speculator.step_allows(len(decodes)):
            return
        rows = sum(item.num_new_tokens for item, _ in picked)
        seqs = [picked[i][1] for i in decodes]
        plans = self.speculator.plan(seqs, rows, budget, self.max_model_len)
        for i, seq, drafts in zip(decodes, seqs, plans, strict=True):
            # The decode's own slot (and any copy-on-write) is in place: this
            # only adds blocks for the drafts, given back in on_step_done.
            if not drafts or not self.kv.can_append(seq, 1 + len(drafts)):
                continue
            self.kv.append_slots(seq, 1 + len(drafts))
            self.policy.on_scheduled(seq, len(drafts))
            picked[i] = (snapshot(seq, 1, self.kv.block_size, drafts), seq)

    def _start(self, seq: Sequence, limit: int, picked, ops: CacheOps) -> int:
        """Start a queued ``seq`` with up to ``limit`` tokens; 0 if it does not fit."""
        if seq.status is SequenceStatus.SWAPPED:
            num_new = min(seq.num_uncomputed_tokens, limit)
            if not self.capacity.swap_in_fits(seq, num_new, self.running):
                return 0
            self.swapped.remove(seq)
            ops.swap_in.extend(self.kv.swap_in(seq))
            self.num_swaps_in += 1
        else:
            plan = self._admit_plan(seq, limit)
            if plan is None:
                return 0
            hits, num_new = plan
            self.waiting.remove(seq)
            self.kv.acquire_prefix(seq, hits)
        seq.status = SequenceStatus.RUNNING
        if seq.num_preemptions:
            # Resumed: it runs a while before a claim may take it again. A
            # first start is not guarded: capacity lent to it is reclaimed
            # at once (its tier's newest sequence goes, before it grew).
            seq.preempt_guard = self.config.preempt_min_steps
        self.running.append(seq)
        self._schedule(seq, num_new, picked, ops)
        return num_new

    def _admit_plan(self, seq: Sequence, budget: int) -> tuple[list[int], int] | None:
        """Prefix hits and first chunk if a waiting ``seq`` can start now."""
        if not self.capacity.seats_free_for(seq, self.running):
            return None
        hits = self.kv.match_prefix(seq)
        num_new = min(seq.num_tokens - len(hits) * self.kv.block_size, budget)
        if not self.capacity.admission_fits(seq, hits, num_new, self.running):
            return None
        return hits, num_new

    def _preempt(self, seq: Sequence, ops: CacheOps) -> None:
        """Swap ``seq`` to the host pool, or drop its KV to recompute later."""
        self.running.remove(seq)
        self.num_preemptions += 1
        seq.num_preemptions += 1
        if self.kv.can_swap_out(seq):
            ops.swap_out.extend(self.kv.swap_out(seq))
            seq.status = SequenceStatus.SWAPPED
            self.swapped.append(seq)
            self.num_swaps_out += 1
        else:
            self.kv.free(seq)
            seq.num_computed_tokens = 0
            seq.status = SequenceStatus.WAITING
            self.waiting.append(seq)
            self.num_recomputes += 1

    def _schedule(self, seq: Sequence, num_new: int, picked, ops: CacheOps) -> None:
        """Give ``seq`` its blocks for ``num_new`` tokens and snapshot them."""
        ops.copies.extend(self.kv.append_slots(seq, num_new))
        self.policy.on_scheduled(seq, num_new)
        picked.append((snapshot(seq, num_new, self.kv.block_size), seq))

    def _batch(self, picked: list[tuple[ScheduledSeq, Sequence]], ops: CacheOps) -> ScheduledBatch:
        now = time.monotonic()
        for _, seq in picked:
            if seq.request.first_scheduled_time is None:
                seq.request.first_scheduled_time = now
        return assemble(picked, ops)

    def on_step_done(
        self, batch: ScheduledBatch, sampled_token_ids: list[int]
    ) -> list[tuple[Sequence, int]]:
        """Finish a step with the runner's sampled tokens (one per
        ``batch.samples``): keep each verification's accepted drafts and
        roll back the rest, advance computed counts, publish newly full
        blocks to the prefix cache, fork the choices of finished prompts,
        append the tokens.

        Returns:
            (sequence, index in ``batch.samples``) of each emitted token, in
            samples order: every sample's, except a verification's targets
            after its first rejected draft.
        """
        if len(sampled_token_ids) != len(batch.samples):
            raise ValueError(
                f"{len(sampled_token_ids)} sampled tokens for {len(batch.samples)} samples"
            )
        accepted = self._verify(batch, sampled_token_ids)
        for item in batch.seqs:
            seq = self.seqs.get(item.seq_id)
            if seq is None or seq.is_finished:
                continue
            computed = len(item.token_ids)
            if item.num_drafts:
                # Accepted drafts are verified tokens now, K/V included;
                # only they count, so no block holding a rejected draft is
                # ever registered, and trim() frees the blocks past them.
                kept = accepted[item.seq_id]
                seq.token_ids.extend(item.token_ids[1 : 1 + kept])
                computed = 1 + kept
            seq.num_computed_tokens += computed
            self.kv.register_full_blocks(seq, computed)
            if item.num_drafts:
                self.kv.trim(seq)
                self.speculator.record(seq, item.num_drafts, kept)
        for parent_id in batch.forks:
            self._fork_choices(self.seqs[parent_id])
        emitted = []
        for index, (sample, token) in enumerate(zip(batch.samples, sampled_token_ids, strict=True)):
            seq = self.seqs[sample.seq_id]
            kept = accepted.get(sample.seq_id)
            if kept is not None and sample.spec_index > kept:
                continue  # after a rejected draft: drawn from a context that never was
            if kept is None or sample.spec_index == kept:
                seq.token_ids.append(token)  # accepted drafts were appended above
            emitted.append((seq, index))
        return emitted

    def _verify(self, batch: ScheduledBatch, tokens: list[int]) -> dict[int, int]:
        """Accepted drafts per verifying sequence id (spec/acceptance.py)."""
        drafts = {item.seq_id: item.token_ids[1:] for item in batch.seqs if item.num_drafts}
        if not drafts:
            return {}
        targets: dict[int, list[int]] = {seq_id: [] for seq_id in drafts}
        for sample, token in zip(batch.samples, tokens, strict=True):
            if sample.seq_id in targets:
                targets[sample.seq_id].append(token)
        return {seq_id: num_accepted(d, targets[seq_id]) for seq_id, d in drafts.items()}

    def _fork_choices(self, parent: Sequence) -> None:
        """The n - 1 sibling choices share the parent's computed prompt
        blocks (copy-on-write) and run from now on.

        They take seats the parent held since it started (capacity.seats):
        like vLLM, an n-choice request starts only when all n choices can
        run side by side, so forking never takes ``running`` past
        ``max_num_seqs`` and no choice waits half-started behind others."""
        request = parent.request
        request.forked = True
        for child in request.seqs:
            if child is parent:
                continue
            self.kv.fork(parent, child)
            child.status = SequenceStatus.RUNNING
            child.preempt_guard = parent.preempt_guard
            self.running.append(child)
            self.seqs[child.seq_id] = child


def _entry() -> dict[str, int]:
    return {"requests": 0, "tokens": 0}


def _count(entry: dict[str, int], seq: Sequence) -> None:
    entry["requests"] += 1
    entry["tokens"] += seq.num_uncomputed_tokens
