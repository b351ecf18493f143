"""Per-request and per-sequence state.

A request asks for ``n`` choices, one sequence each. Only the first is
queued and computes the prompt; when the prompt is done the scheduler forks
the other ``n - 1`` from it (they share its KV blocks copy-on-write) and
they run from then on.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from enum import Enum, auto

from gpuworkers.engine.sampling_params import SamplingParams
from gpuworkers.engine.spec.state import SpecState


class SequenceStatus(Enum):
    WAITING = auto()  # not yet admitted, or preempted for recompute
    RUNNING = auto()  # holds KV blocks on the device
    SWAPPED = auto()  # KV blocks moved to the host pool
    FINISHED = auto()


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

    @property
    def is_finished(self) -> bool:
        # Siblings exist (unfinished) from the start, so "all sequences
        # finished" is the whole test.
        return bool(self.seqs) and all(s.is_finished for s in self.seqs)
