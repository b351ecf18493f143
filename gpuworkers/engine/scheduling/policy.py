"""Scheduling policies: the scheduler's choices, kept apart from its acting.

A policy orders and chooses; the ``Scheduler`` allocates, preempts, swaps
and builds the batch. Each step the scheduler calls, in this order:

1. ``begin_step``: the policy sees the queues and the token budget; it
   returns *claims*, queued sequences entitled to take running capacity
   back. For each claim that does not fit, the scheduler preempts
   ``reclaim_victim(claim)`` until it fits or there is none.
2. ``serving_key``: the order in which running sequences are served.
3. ``plan_running``: every decode its token, then ``chunk_cap`` for each
   prefill chunk, each in serving order (decodes first under every
   policy). Then blocks for the plan in serving order: ``pick_victim``
   while one cannot grow (the victim is preempted).
4. Unless something was preempted in 3: ``next_to_admit`` (a swapped or
   waiting sequence), ``chunk_cap``, then ``admitted`` with the tokens it
   got (0: it did not fit), until the budget runs out or it returns None.
5. ``on_scheduled`` for every sequence given tokens in 3 and 4.

FCFS and Priority differ only in their queue order; Fair (fair_policy.py)
shares capacity and budget between tiers.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from gpuworkers.engine.sequence import Sequence


@dataclass(slots=True)
class Queues:
    """The scheduler's queues. Policies read them; only the scheduler changes them."""

    waiting: list[Sequence] = field(default_factory=list)  # new, or preempted to recompute
    running: list[Sequence] = field(default_factory=list)  # holding device blocks
    swapped: list[Sequence] = field(default_factory=list)  # KV in the host pool


def priority_key(seq: Sequence):
    """Higher priority first, then earlier arrival."""
    request = seq.request
    return (-request.priority, request.arrival_time, seq.seq_id)


class SchedulingPolicy:
    """Base policy: one strict order for everything, no claims, no caps."""

    name = ""

    def __init__(self) -> None:
        self.queues = Queues()
        self._order: list[Sequence] | None = None
        self._next = 0

    def queue_key(self, seq: Sequence):
        """Sort key of the waiting (and swapped) queue: smallest goes first."""
        raise NotImplementedError

    def begin_step(self, queues: Queues, budget: int) -> list[Sequence]:
        """Start a step over ``queues`` with ``budget`` tokens.

        Returns:
            Claims: queued sequences for which running capacity is to be
            taken back (see ``reclaim_victim``), in the order to serve them.
        """
        self.queues = queues
        self._order = None
        return []

    def reclaim_victim(self, claim: Sequence) -> Sequence | None:
        """A running sequence to preempt so that ``claim`` fits, or None."""
        return None

    def serving_key(self) -> Callable[[Sequence], object]:
        """Sort key for the running sequences this step (after any reclaim).

        Served first, preempted last: under memory pressure the victims
        come from the end of this order. The scheduler still gives every
        decode its token before any prefill chunk takes budget.
        """
        return self.queue_key

    def plan_running(self, running: list[Sequence], budget: int) -> dict[int, int]:
        """Tokens per sequence id for ``running`` (in serving order) this
        step: every decode its token first, then a prefill chunk (prompt or
        recompute) each, within ``budget``. Not for policies to change: the
        serving order ranks decodes among decodes and chunks among chunks,
        but a chunk never starves a decode, as an old or high-priority long
        prompt would if one order ranked both."""
        plan: dict[int, int] = {}
        for seq in running:
            if budget and not seq.is_prefilling:
                plan[seq.seq_id] = 1
                budget -= 1
        for seq in running:
            if budget and seq.is_prefilling:
                num_new = min(seq.num_uncomputed_tokens, budget, self.chunk_cap(seq, budget))
                plan[seq.seq_id] = num_new
                budget -= num_new
        return plan

    def pick_victim(self, unscheduled: list[Sequence]) -> Sequence:
        """The sequence to preempt when a running one cannot grow.

        Args:
            unscheduled: the running sequences not yet served this step, in
                serving order; the one that cannot grow is the first.
        """
        return unscheduled[-1]

    def chunk_cap(self, seq: Sequence, budget: int) -> int:
        """Most tokens ``seq`` may compute this step, ``budget`` being left.

        Asked for each prefill chunk of a running sequence and for each
        queued sequence about to start.
        """
        return budget

    def next_to_admit(self) -> Sequence | None:
        """The queued sequence to start next, or None to start no more.

        Swapped sequences come back before waiting ones start: they have
        made progress and hold host blocks. Strict order: once the head
        does not fit nothing behind it starts, so a large request is not
        overtaken forever by smaller ones.
        """
        if self._order is None:
            # Sorted once, when the step reaches admission: the queues only
            # lose members from here on (the sequences started).
            self._order = sorted(self.queues.swapped, key=self.queue_key)
            self._order += sorted(self.queues.waiting, key=self.queue_key)
            self._next = 0
        if self._next >= len(self._order):
            return None
        return self._order[self._next]

    def admitted(self, seq: Sequence, num_tokens: int) -> None:
        """``seq`` (from next_to_admit) started with ``num_tokens``; 0: it did not fit."""
        if num_tokens:
            self._next += 1
        else:
            self._next = len(self._order)

    def on_scheduled(self, seq: Sequence, num_tokens: int) -> None:
        """``seq`` computes ``num_tokens`` this step (accounting hook)."""

    def tier_label(self, seq: Sequence) -> str:
        """The tier a queued sequence counts under in ``queued_by_tier``."""
        return seq.request.tier or ""

    def queue_positions(self, queues: Queues) -> dict[str, dict]:
        """Per tier, what is ahead of each tenant's next request, for
        admission control; empty where the order knows no tenants."""
        return {}


class FCFSPolicy(SchedulingPolicy):
    """Arrival order only."""

    name = "fcfs"

    def queue_key(self, seq: Sequence):
        return (seq.request.arrival_time, seq.seq_id)


class PriorityPolicy(SchedulingPolicy):
    """Higher ``priority`` first, then arrival; the newest of the lowest
    priority is preempted first."""

    name = "priority"

    def queue_key(self, seq: Sequence):
        return priority_key(seq)
