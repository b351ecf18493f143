"""What the scheduler hands the model runner each step: plain data.

Everything the runner needs is copied here when the step is scheduled, so
the runner never reads a ``Sequence`` (which the scheduler changes as soon
as the step is done). The scheduler, in turn, only learns what the step
produced from the runner's return value (``Scheduler.on_step_done`` takes
the sampled tokens): running the step before finishing it is a matter of
data flow. Modelled on vLLM v1's ``SchedulerOutput`` / ``NewRequestData``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gpuworkers.engine.sampling_params import SamplingParams
from gpuworkers.engine.sequence import Sequence


@dataclass(slots=True)
class CacheOps:
    """Block copies the runner does before the step's forward pass, in this order."""

    # (device block, host block): KV of preempted sequences moved to the host pool.
    swap_out: list[tuple[int, int]] = field(default_factory=list)
    # (host block, device block): KV of resumed sequences brought back.
    swap_in: list[tuple[int, int]] = field(default_factory=list)
    # (source, destination) device blocks: copy-on-write of a partial block
    # shared by forked choices, before either writes into it.
    copies: list[tuple[int, int]] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.swap_out or self.swap_in or self.copies)


@dataclass(slots=True)
class ScheduledSeq:
    """One sequence's share of a step."""

    seq_id: int
    # Tokens to compute now: a decode's last sampled token, or a prefill chunk.
    token_ids: list[int]
    # Their positions, contiguous: ``positions.start`` tokens of this
    # sequence are already in the cache (the context this step attends to).
    positions: range
    # Device blocks holding positions [0, positions.stop): the sequence's
    # block table, trimmed to what this step reads and writes.
    block_ids: list[int]
    # Cache slot (block * block_size + offset) of each of token_ids.
    slot_mapping: list[int]
    # The chunk ends at the sequence's last token (a decode, or a prompt's
    # last chunk): the runner computes logits for its last position.
    needs_logits: bool
    # Speculative verification: the last ``num_drafts`` of token_ids are
    # drafts (after the sequence's last token), and the runner computes
    # logits at every position. Their slots are rolled back if rejected.
    num_drafts: int = 0

    @property
    def num_new_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def context_len(self) -> int:
        return self.positions.start


@dataclass(slots=True)
class SampleInput:
    """One token to draw: which logits row, for which choice, how."""

    # Row of the step's logits: the index among ``needs_logits`` sequences.
    row: int
    # The choice that receives the token. Siblings of an n > 1 prompt share
    # the prompt's row on the step its prefill completes.
    seq_id: int
    params: SamplingParams
    # The choice's random stream; this draw is number ``num_output_tokens``
    # of it, so a seeded choice draws the same whatever the batch.
    seed: int = 0
    # Output tokens the choice has: the draw index, and what min_tokens counts.
    num_output_tokens: int = 0
    # Prompt + output ids, copied only for penalties and bad words (else empty).
    token_ids: list[int] = field(default_factory=list)
    num_prompt_tokens: int = 0
    # Ids to mask because min_tokens is not reached yet (else empty).
    min_tokens_ids: tuple[int, ...] = ()
    # The request's bad words as token sequences (shared, never changed).
    bad_words_ids: tuple[tuple[int, ...], ...] = ()
    # The choice's structured-output state (``structured.GrammarState``),
    # not a copy: it advances only when the engine appends this step's
    # token, after the runner has returned.
    grammar: object | None = None
    # In a verification: the position among its 1 + k (the draw after j
    # drafts, as if they had been accepted); 0 otherwise.
    spec_index: int = 0


@dataclass(slots=True)
class PromptLogprobsInput:
    """A prefill chunk of a ``prompt_logprobs`` request: the prompt tokens
    its logits predict (the logits at position p predict token p + 1)."""

    # Index of the chunk in ``ScheduledBatch.seqs``.
    index: int
    seq_id: int
    # Positions whose logits are needed; a subrange of the chunk's.
    positions: range
    # The prompt tokens they predict, one per position.
    target_ids: list[int]
    # Alternatives per token (params.prompt_logprobs).
    k: int


@dataclass(slots=True)
class ScheduledBatch:
    """One engine step: cache operations, then one forward pass, then sampling."""

    # Single-token rows (decodes) first, by context length so that the
    # torch backend's gather path pads less; then verifications (a decode
    # with its drafts); then prefill chunks, in the order they were served.
    seqs: list[ScheduledSeq] = field(default_factory=list)
    # Tokens to sample, in row order; the runner returns one result each.
    samples: list[SampleInput] = field(default_factory=list)
    # Prefill chunks whose prompt-token logprobs are wanted, in seqs order.
    prompt_logprobs: list[PromptLogprobsInput] = field(default_factory=list)
    cache_ops: CacheOps = field(default_factory=CacheOps)
    # Sequences whose prompt completes this step for an n > 1 request: when
    # the step is done their sibling choices fork off the prompt's blocks
    # (copy-on-write). Scheduler bookkeeping; the runner ignores it.
    forks: list[int] = field(default_factory=list)
    # Prompt tokens among the scheduled ones (recomputed outputs excluded),
    # for the engine's statistics.
    num_prompt_tokens: int = 0
    # A scheduled request asked for deterministic mode: the runner runs the
    # whole step's forward pass batch-invariant.
    deterministic: bool = False

    @property
    def num_batched_tokens(self) -> int:
        return sum(len(s.token_ids) for s in self.seqs)

    @property
    def num_decodes(self) -> int:
        """Leading single-token rows (the order puts them first)."""
        count = 0
        for item in self.seqs:
            if len(item.token_ids) != 1:
                break
            count += 1
        return count

    @property
    def num_verifications(self) -> int:
        """Sequences verifying drafts (they follow the decodes)."""
        return sum(1 for item in self.seqs if item.num_drafts)

    @property
    def is_empty(self) -> bool:
        return not (self.seqs or self.cache_ops)


def snapshot(
    seq: Sequence, num_new: int, block_size: int, drafts: list[int] | None = None
) -> ScheduledSeq:
    """Copy what the runner needs to compute ``seq``'s next ``num_new``
    tokens (a decode and its ``drafts`` to verify); its blocks for them
    must be allocated already."""
    start = seq.num_computed_tokens
    end = start + num_new + len(drafts or ())
    table = seq.block_table
    if end - start == 1:
        # Most of a step's sequences are decodes: one slot, no loop.
        block, offset = divmod(start, block_size)
        slots = [table[block] * block_size + offset]
    else:
        slots = [table[p // block_size] * block_size + p % block_size for p in range(start, end)]
    return ScheduledSeq(
        seq.seq_id,
        seq.token_ids[start : start + num_new] + list(drafts or ()),
        range(start, end),
        table[: -(-end // block_size)],
        slots,
        start + num_new == seq.num_tokens,
        len(drafts or ()),
    )


def assemble(picked: list[tuple[ScheduledSeq, Sequence]], cache_ops: CacheOps) -> ScheduledBatch:
    """The step's batch from its snapshots (with their sequences, for the
    sampling inputs), in the runner's layout."""
    # Single-token work (decodes) before chunks, as the runner's layout
    # requires; decodes by context length so the torch backend can group
    # similar lengths and pad less. Chunks keep serving order (stable sort).
    picked = sorted(picked, key=_layout_key)
    batch = ScheduledBatch(seqs=[item for item, _ in picked], cache_ops=cache_ops)
    row = 0
    for index, (item, seq) in enumerate(picked):
        batch.deterministic |= seq.request.params.deterministic
        start = item.context_len
        batch.num_prompt_tokens += max(0, min(item.positions.stop, seq.num_prompt_tokens) - start)
        if seq.request.prompt_logprobs is not None:
            _want_prompt_logprobs(batch, index, item, seq)
        if not item.needs_logits:
            continue
        request = seq.request
        choices = [seq]
        if request.params.n > 1 and not request.forked and seq is request.seqs[0]:
            # The prompt is done: the other choices draw their first token
            # from the same logits, then fork off its blocks.
            batch.forks.append(seq.seq_id)
            choices = request.seqs
        if item.num_drafts:
            # One draw per verified position, each with the inputs the plain
            # sampler would use there had the drafts before it been emitted
            # (penalties, bad words, min_tokens and the draw index see them).
            drafts = item.token_ids[1:]
            for j in range(item.num_drafts + 1):
                batch.samples.append(_sample_input(row + j, seq, drafts[:j]))
            row += item.num_drafts + 1
            continue
        for choice in choices:
            batch.samples.append(_sample_input(row, choice))
        row += 1
    return batch


def _sample_input(row: int, seq: Sequence, drafts: list[int] | None = None) -> SampleInput:
    request = seq.request
    params = request.params
    ahead = len(drafts) if drafts else 0
    num_output = seq.num_output_tokens + ahead
    sample = SampleInput(row, seq.seq_id, params, seq.seed, num_output, spec_index=ahead)
    # Never with drafts: a request with a grammar does not speculate.
    sample.grammar = seq.grammar
    if params.uses_penalties or request.bad_words_ids:
        # A copy: the scheduler appends to token_ids once the step is done.
        sample.token_ids = seq.token_ids + drafts if drafts else list(seq.token_ids)
        sample.num_prompt_tokens = seq.num_prompt_tokens
        sample.bad_words_ids = request.bad_words_ids
    if num_output < params.min_tokens:
        sample.min_tokens_ids = request.min_tokens_ids
    return sample


def _want_prompt_logprobs(batch: ScheduledBatch, index: int, item: ScheduledSeq, seq: Sequence):
    """Ask for the logits of the chunk's positions that predict prompt
    tokens not yet scored (a recompute after preemption scores none twice)."""
    scored = len(seq.request.prompt_logprobs)  # tokens [0, scored) have entries
    first = max(item.positions.start, scored - 1)
    stop = min(item.positions.stop, seq.num_prompt_tokens - 1)
    if seq.index == 0 and first < stop:
        targets = seq.token_ids[first + 1 : stop + 1]
        k = seq.request.params.prompt_logprobs or 0
        batch.prompt_logprobs.append(
            PromptLogprobsInput(index, seq.seq_id, range(first, stop), targets, k)
        )


def _layout_key(picked: tuple[ScheduledSeq, Sequence]) -> tuple[int, int]:
    item = picked[0]
    if len(item.token_ids) == 1:
        return (0, item.positions.start)
    if item.num_drafts:
        return (1, item.positions.start)
    return (2, 0)
