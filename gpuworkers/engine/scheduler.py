"""Iteration-level continuous batching with a token budget per step.

Each step: running sequences first (one token per decode, a chunk per
prefill), then swapped-out sequences back in, then new admissions, until the
token budget or the sequence cap runs out. When a running sequence cannot
grow, the lowest-priority, newest running sequence is preempted: swapped to
the host pool if it fits there, recomputed later otherwise.

Under SchedulingPolicy.FAIR (fair_share.py) tiers share the running
capacity and the token budget by weight: queued work of a tier under its
share goes first and, when it does not fit, takes lent capacity back by
preempting the tier most over its share; prefill chunks and admissions are
served by each tier's credit.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from gpuworkers.engine.config import AdmissionPolicy, EngineConfig, SchedulingPolicy
from gpuworkers.engine.fair_share import FairSchedulingMixin, FairShare
from gpuworkers.engine.kv_manager import KVCacheManager
from gpuworkers.engine.sequence import Sequence, SequenceStatus


@dataclass(slots=True)
class ScheduledSeq:
    seq: Sequence
    # Tokens computed this step, from seq.num_computed_tokens on.
    num_new_tokens: int
    # The chunk reaches the sequence's last token: sample from its logits.
    needs_sample: bool


@dataclass(slots=True)
class SchedulerOutput:
    """What the model runner executes this step, in this order."""

    # (device block, host block) copies, done before the forward pass.
    swap_out: list[tuple[int, int]] = field(default_factory=list)
    # (host block, device block) copies, done before the forward pass.
    swap_in: list[tuple[int, int]] = field(default_factory=list)
    # Copy-on-write (source, destination) device block copies.
    copies: list[tuple[int, int]] = field(default_factory=list)
    # Decodes first, then prefill chunks; the runner flattens them in order.
    scheduled: list[ScheduledSeq] = field(default_factory=list)

    @property
    def num_batched_tokens(self) -> int:
        return sum(s.num_new_tokens for s in self.scheduled)

    @property
    def is_empty(self) -> bool:
        return not (self.scheduled or self.swap_out or self.swap_in or self.copies)


class Scheduler(FairSchedulingMixin):
    def __init__(self, config: EngineConfig, kv: KVCacheManager, max_model_len: int):
        self.config = config
        self.kv = kv
        self.max_model_len = max_model_len
        self.waiting: list[Sequence] = []
        self.running: list[Sequence] = []
        self.swapped: list[Sequence] = []
        self.num_preemptions = 0
        self.num_swaps_out = 0
        self.num_swaps_in = 0
        self.num_recomputes = 0
        self.fair = (
            FairShare(config.tier_weights, config.max_num_seqs, kv.num_total)
            if config.scheduling_policy is SchedulingPolicy.FAIR
            else None
        )

    # Queues -----------------------------------------------------------

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running or self.swapped)

    def remove(self, seq: Sequence) -> None:
        """Take ``seq`` out of whichever queue holds it and free its KV."""
        for queue in (self.waiting, self.running, self.swapped):
            if seq in queue:
                queue.remove(seq)
        self.kv.free(seq)

    def queued_by_tier(self) -> dict[str, dict[str, int]]:
        """Waiting and swapped sequences and their tokens to compute, per
        tier: what admission control needs to estimate a tier's wait."""
        queued: dict[str, dict[str, int]] = {}
        for seq in self.waiting + self.swapped:
            tier = self.fair.tier_of(seq) if self.fair else (seq.request.tier or "")
            entry = queued.setdefault(tier, {"requests": 0, "tokens": 0})
            entry["requests"] += 1
            entry["tokens"] += seq.num_uncomputed_tokens
        return queued

    def _order_key(self, seq: Sequence):
        request = seq.request
        if self.config.scheduling_policy is SchedulingPolicy.FCFS:
            return (request.arrival_time, seq.seq_id)
        return (-request.priority, request.arrival_time, seq.seq_id)

    # Reservations -------------------------------------------------------

    def _reserved_blocks(self, seq: Sequence) -> int:
        """Blocks ``seq`` may still need to reach its longest possible length."""
        params = seq.request.params
        final = min(seq.num_prompt_tokens + params.max_tokens, self.max_model_len)
        return max(self.kv.blocks_for(final) - len(seq.block_table), 0)

    def _future_growth(self, extra: list[Sequence] = ()) -> int:
        growth = sum(self._reserved_blocks(s) for s in self.running)
        growth += sum(self._reserved_blocks(s) for s in extra)
        for seq in self.running:
            request = seq.request
            # Choices not forked yet grow from the shared prompt on their own.
            if seq is request.seqs[0] and not request.forked and request.params.n > 1:
                per_choice = self.kv.blocks_for(request.params.max_tokens) + 1
                growth += (request.params.n - 1) * per_choice
        return growth

    def _admission_fits(self, seq: Sequence, hits: list[int], num_new: int) -> bool:
        free_after_hits = self.kv.num_free_after_hits(hits)
        if self.config.admission_policy is AdmissionPolicy.OPTIMISTIC:
            needed = self.kv.blocks_for(len(hits) * self.kv.block_size + num_new) - len(hits)
            return needed <= free_after_hits
        params = seq.request.params
        final = min(seq.num_prompt_tokens + params.max_tokens, self.max_model_len)
        needed = self.kv.blocks_for(final) - len(hits)
        if params.n > 1:
            needed += (params.n - 1) * (self.kv.blocks_for(params.max_tokens) + 1)
        return needed + self._future_growth() <= free_after_hits

    # The step -----------------------------------------------------------

    def schedule(self) -> SchedulerOutput:
        out = SchedulerOutput()
        budget = self.config.max_num_batched_tokens
        pending, demand = self._fair_plan(out, budget) if self.fair else ({}, {})
        self.running.sort(key=self._running_key())
        queue = list(self.running)
        preempted = False
        i = 0
        while i < len(queue) and budget > 0:
            seq = queue[i]
            num_new = min(seq.num_uncomputed_tokens, budget)
            if self.fair and seq.is_prefilling:
                num_new = min(num_new, self._fair_cap(seq, budget, demand))
            while not self.kv.can_append(seq, num_new):
                victim = self._victim(queue, i)
                self._preempt(victim, out)
                preempted = True
                if victim is seq:
                    break
            else:
                self._schedule_seq(out, seq, num_new)
                budget -= num_new
                i += 1
        if not preempted and self.fair:
            self._fair_admit(out, budget, pending, demand)
        elif not preempted:
            budget = self._swap_in(out, budget)
            if not self.swapped:
                self._admit(out, budget)
        # Single-token work (decodes) before chunks, as the runner's batch
        # layout requires; decodes by context length so the runner can group
        # similar lengths and pad less. Chunks keep priority order (stable).
        out.scheduled.sort(
            key=lambda s: (
                s.num_new_tokens > 1,
                s.seq.num_computed_tokens * (s.num_new_tokens == 1),
            )
        )
        now = time.monotonic()
        for item in out.scheduled:
            if item.seq.request.first_scheduled_time is None:
                item.seq.request.first_scheduled_time = now
        return out

    def _running_key(self):
        if self.fair is None:
            return self._order_key
        fair = self.fair
        levels = fair.levels(self.running, self._blocks_held)

        def key(seq: Sequence):
            # Decodes first, the tiers furthest under their share first, so
            # that over-share tiers' sequences are still unscheduled when
            # one must be preempted; then prefill chunks by credit.
            tier = fair.tier_of(seq)
            return (
                seq.is_prefilling,
                levels.get(tier, 0.0),
                -fair.credit_of(tier),
                self._order_key(seq),
            )

        return key

    def _victim(self, queue: list[Sequence], i: int) -> Sequence:
        """Lowest-priority, newest unscheduled sequence (under fair share:
        of the tier most over its share)."""
        if self.fair is None:
            return queue.pop()
        rest = queue[i:]
        victim = self.fair.pick_victim(rest, self.running, self._blocks_held) or max(
            rest, key=lambda s: (-s.request.priority, s.request.arrival_time, s.seq_id)
        )
        queue.remove(victim)
        return victim

    def _schedule_seq(self, out: SchedulerOutput, seq: Sequence, num_new: int) -> None:
        out.copies.extend(self.kv.append_slots(seq, num_new))
        out.scheduled.append(
            ScheduledSeq(seq, num_new, seq.num_computed_tokens + num_new == seq.num_tokens)
        )
        if self.fair:
            self.fair.charge(seq, num_new)

    def _swap_in_fits(self, seq: Sequence, num_new: int) -> bool:
        if len(self.running) >= self.config.max_num_seqs:
            return False
        if not self.kv.can_swap_in(seq, num_new):
            return False
        if self.config.admission_policy is AdmissionPolicy.RESERVE:
            need = len(seq.host_block_table) + self._reserved_blocks(seq)
            return need + self._future_growth() <= self.kv.num_free
        return True

    def _start_swapped(self, out: SchedulerOutput, seq: Sequence, num_new: int) -> None:
        self.swapped.remove(seq)
        out.swap_in.extend(self.kv.swap_in(seq))
        self.num_swaps_in += 1
        seq.status = SequenceStatus.RUNNING
        self.running.append(seq)
        self._schedule_seq(out, seq, num_new)

    def _swap_in(self, out: SchedulerOutput, budget: int) -> int:
        self.swapped.sort(key=self._order_key)
        while self.swapped and budget > 0:
            seq = self.swapped[0]
            num_new = min(seq.num_uncomputed_tokens, budget)
            if not self._swap_in_fits(seq, num_new):
                break
            self._start_swapped(out, seq, num_new)
            budget -= num_new
        return budget

    def _admit_plan(self, seq: Sequence, budget: int) -> tuple[list[int], int] | None:
        """Prefix hits and first chunk if ``seq`` can be admitted now."""
        if len(self.running) >= self.config.max_num_seqs:
            return None
        hits = self.kv.match_prefix(seq)
        num_new = min(seq.num_tokens - len(hits) * self.kv.block_size, budget)
        return (hits, num_new) if self._admission_fits(seq, hits, num_new) else None

    def _start_waiting(self, out: SchedulerOutput, seq: Sequence, hits, num_new: int) -> None:
        self.waiting.remove(seq)
        self.kv.acquire_prefix(seq, hits)
        seq.status = SequenceStatus.RUNNING
        self.running.append(seq)
        self._schedule_seq(out, seq, num_new)

    def _admit(self, out: SchedulerOutput, budget: int) -> None:
        self.waiting.sort(key=self._order_key)
        while self.waiting and budget > 0:
            seq = self.waiting[0]
            plan = self._admit_plan(seq, budget)
            if plan is None:
                # Strict order: a large request at the head is not overtaken
                # forever by smaller ones behind it.
                break
            self._start_waiting(out, seq, *plan)
            budget -= plan[1]

    def _preempt(self, seq: Sequence, out: SchedulerOutput) -> None:
        """Swap ``seq`` to the host pool, or drop its KV to recompute later."""
        self.running.remove(seq)
        self.num_preemptions += 1
        if self.kv.can_swap_out(seq):
            out.swap_out.extend(self.kv.swap_out(seq))
            seq.status = SequenceStatus.SWAPPED
            self.swapped.append(seq)
            self.num_swaps_out += 1
        else:
            self.kv.free(seq)
            seq.num_computed_tokens = 0
            seq.status = SequenceStatus.WAITING
            self.waiting.append(seq)
            self.num_recomputes += 1

    def on_step_done(self, out: SchedulerOutput) -> None:
        """Advance computed counts and publish newly full blocks to the cache."""
        for item in out.scheduled:
            seq = item.seq
            if seq.is_finished:
                continue
            seq.num_computed_tokens += item.num_new_tokens
            self.kv.register_full_blocks(seq)
