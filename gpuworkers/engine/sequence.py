"""Per-request and per-sequence state.

A request asks for ``n`` choices, one sequence each. Only the first is
queued and computes the prompt; when the prompt is done the scheduler forks
the other ``n - 1`` from it (they share its KV blocks copy-on-write) and
they run from then on.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from enum import Enum, StrEnum, auto

from gpuworkers.engine.sampling_params import SamplingParams
from gpuworkers.engine.spec.state import SpecState


class SequenceStatus(Enum):
    WAITING = auto()  # not yet admitted, or preempted for recompute
    RUNNING = auto()  # holds KV blocks on the device
    SWAPPED = auto()  # KV blocks moved to the host pool
    FINISHED = auto()


class ServiceClass(StrEnum):
    """A request's scheduling class within its tenant (and, for batch, below
    every interactive request).

    Interactive classes only order a tenant's own requests (priority, then
    default, then flex); the tenant's place among the others is its fair
    share. Batch takes only the capacity interactive work leaves and is
    preempted first when interactive work waits for KV.
    """

    PRIORITY = "priority"
    DEFAULT = "default"
    FLEX = "flex"
    BATCH = "batch"

    @property
    def rank(self) -> int:
        """0 for the highest class; larger ranks start later and are preempted first."""
        return _CLASS_RANK[self]


_CLASS_RANK = {c: i for i, c in enumerate(ServiceClass)}


@dataclass(slots=True, eq=False)
class Sequence:
    """One choice's tokens and where its KV lives."""

    seq_id: int
    request: Request
    index: int  # choice index within the request
    token_ids: list[int]
    num_prompt_tokens: int
    status: SequenceStatus = SequenceStatus.WAITING
    # Tokens whose KV is in the cache (computed or taken from the prefix cache).
    num_computed_tokens: int = 0
    # Tokens whose KV came from the prefix cache at admission.
    num_cached_tokens: int = 0
    block_table: list[int] = field(default_factory=list)
    # Chained hashes of this sequence's full blocks, in order.
    block_hashes: list[bytes] = field(default_factory=list)
    host_block_table: list[int] = field(default_factory=list)
    finish_reason: str | None = None
    # Per-sequence sampling state, set by the engine. ``seed`` names the
    # choice's counter-based random stream (draw k is its k-th output token).
    seed: int = 0
    detokenizer: object | None = None
    logprobs: list | None = None
    # With params.structured_output: where the choice is in its grammar
    # (structured.GrammarState), advanced by each appended token.
    grammar: object | None = None
    # Speculative decoding: drafted / accepted counts and back-off.
    spec: SpecState = field(default_factory=SpecState)
    # Times preempted (swapped out or dropped to recompute).
    num_preemptions: int = 0
    # Progress guarantee: engine steps left before a claim may preempt it
    # again (set when it resumes after a preemption; 0: it may).
    preempt_guard: int = 0
    # The tenant's virtual token counter is paid up to this position: a
    # recompute after preemption is not charged again, and prefix-cache
    # hits (never computed) never are.
    num_charged_tokens: int = 0

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens :]

    @property
    def num_uncomputed_tokens(self) -> int:
        return len(self.token_ids) - self.num_computed_tokens

    @property
    def is_prefilling(self) -> bool:
        """More than one token still to compute (prompt, or a recompute
        after preemption: prefilling prompt + outputs again yields exactly
        the next token a decode step would have)."""
        return self.num_uncomputed_tokens > 1

    @property
    def is_finished(self) -> bool:
        return self.status is SequenceStatus.FINISHED


@dataclass(slots=True, eq=False)
class Request:
    """One ``add_request`` call: prompt, sampling settings, priority."""

    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    priority: int = 0
    tier: str | None = None
    cache_salt: str | None = None
    # Who the request is for (fair share between tenants inside a tier;
    # None: one anonymous tenant per tier, as offline use has).
    tenant: str | None = None
    service_class: ServiceClass = ServiceClass.DEFAULT
    arrival_time: float = field(default_factory=time.monotonic)
    first_scheduled_time: float | None = None
    first_token_time: float | None = None
    # All n choices, by index. Until ``forked`` the siblings of seqs[0] are
    # WAITING in no queue: they hold nothing and are never scheduled.
    seqs: list[Sequence] = field(default_factory=list)
    # Set once the n-1 sibling choices have been forked from seqs[0].
    forked: bool = False
    aborted: bool = False
    # Derived from params and the model once, by the engine (sampling/request.py).
    # Token ids that end a choice: stop_token_ids, plus EOS unless ignore_eos.
    stop_ids: frozenset[int] = frozenset()
    # Masked until a choice has min_tokens outputs: stop_token_ids and EOS.
    min_tokens_ids: tuple[int, ...] = ()
    # Token sequences of params.bad_words.
    bad_words_ids: tuple[tuple[int, ...], ...] = ()
    # params.structured_output compiled (structured.CompiledGrammar).
    grammar: object | None = None
    # With params.prompt_logprobs: one entry per prompt token computed so
    # far (TokenLogprob; None for the first token, which nothing predicts).
    prompt_logprobs: list | None = None
    prompt_logprobs_sent: bool = False

    def __post_init__(self) -> None:
        self.service_class = ServiceClass(self.service_class)

    @property
    def is_batch(self) -> bool:
        return self.service_class is ServiceClass.BATCH

    @property
    def is_finished(self) -> bool:
        # Siblings exist (unfinished) from the start, so "all sequences
        # finished" is the whole test.
        return bool(self.seqs) and all(s.is_finished for s in self.seqs)
