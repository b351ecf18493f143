"""KV and slot arithmetic: what a sequence holds, may still need, and
whether starting it now fits under the admission policy.

Shared by the scheduler (admission, swap-in) and the fair policy (a
tier's footprint), so that both count blocks the same way.
"""

from __future__ import annotations

from gpuworkers.engine.config import AdmissionPolicy, EngineConfig
from gpuworkers.engine.kv_manager import KVCacheManager
from gpuworkers.engine.sampling_params import SamplingParams
from gpuworkers.engine.sequence import Sequence


def seats(seq: Sequence) -> int:
    """Running slots ``seq`` stands for: an n-choice prompt not yet forked
    holds its n - 1 siblings' seats too, so that the fork never takes
    ``running`` past ``max_num_seqs``."""
    request = seq.request
    if seq is request.seqs[0] and not request.forked:
        return request.params.n
    return 1


class Capacity:
    def __init__(self, config: EngineConfig, kv: KVCacheManager, max_model_len: int):
        self.config = config
        self.kv = kv
        self.max_model_len = max_model_len

    @property
    def num_blocks(self) -> int:
        return self.kv.num_total

    def final_blocks(self, seq: Sequence) -> int:
        """Blocks ``seq`` holds at its longest possible length."""
        return self._final(seq.num_prompt_tokens, seq.request.params.max_tokens)

    def request_blocks(self, num_prompt_tokens: int, params: SamplingParams) -> int:
        """Blocks a whole request may hold at once: the first choice at
        its longest, plus each other choice's own growth (the arithmetic of
        ``admission_fits`` for a request not yet started). A request
        needing more than the pool can never run."""
        first = self._final(num_prompt_tokens, params.max_tokens)
        return first + (params.n - 1) * self._per_choice(params.max_tokens)

    def seats_in_use(self, running: list[Sequence]) -> int:
        return sum(seats(s) for s in running)

    def seats_free_for(self, seq: Sequence, running: list[Sequence]) -> bool:
        """Whether ``seq`` may join ``running`` under ``max_num_seqs``."""
        return self.seats_in_use(running) + seats(seq) <= self.config.max_num_seqs

    def reserved_blocks(self, seq: Sequence) -> int:
        """Blocks ``seq`` may still need to reach its longest possible length."""
        return max(self.final_blocks(seq) - len(seq.block_table), 0)

    def future_growth(self, running: list[Sequence]) -> int:
        """Blocks the running sequences may still take, forks to come included."""
        return sum(self.reserved_blocks(s) + self._unforked_growth(s) for s in running)

    def footprint(self, seq: Sequence) -> int:
        """KV a sequence holds or, queued, will hold: its whole reservation
        under RESERVE (what it keeps others from using), else its size."""
        if self.config.admission_policy is AdmissionPolicy.RESERVE:
            return self.final_blocks(seq) + self._unforked_growth(seq)
        return max(len(seq.block_table), self.kv.blocks_for(seq.num_tokens))

    def admission_fits(
        self, seq: Sequence, hits: list[int], num_new: int, running: list[Sequence]
    ) -> bool:
        """Whether a waiting ``seq`` may start with prefix ``hits`` and a
        first chunk of ``num_new`` tokens.

        OPTIMISTIC: the first chunk fits now. RESERVE: its whole growth
        (all n choices) fits beside every running sequence's.
        """
        kv = self.kv
        free_after_hits = kv.num_free_after_hits(hits)
        if self.config.admission_policy is AdmissionPolicy.OPTIMISTIC:
            needed = kv.blocks_for(len(hits) * kv.block_size + num_new) - len(hits)
            return needed <= free_after_hits
        needed = self.final_blocks(seq) - len(hits) + self._unforked_growth(seq)
        return needed + self.future_growth(running) <= free_after_hits

    def swap_in_fits(self, seq: Sequence, num_new: int, running: list[Sequence]) -> bool:
        """Whether a swapped ``seq`` may come back and compute ``num_new`` tokens."""
        if not self.seats_free_for(seq, running):
            return False
        if not self.kv.can_swap_in(seq, num_new):
            return False
        if self.config.admission_policy is AdmissionPolicy.RESERVE:
            need = len(seq.host_block_table) + self.reserved_blocks(seq)
            # A prompt swapped out before its fork still owes its siblings' growth.
            need += self._unforked_growth(seq)
            return need + self.future_growth(running) <= self.kv.num_free
        return True

    def _unforked_growth(self, seq: Sequence) -> int:
        # Choices not forked yet grow from the shared prompt on their own.
        return (seats(seq) - 1) * self._per_choice(seq.request.params.max_tokens)

    def _final(self, num_prompt_tokens: int, max_tokens: int) -> int:
        return self.kv.blocks_for(min(num_prompt_tokens + max_tokens, self.max_model_len))

    def _per_choice(self, max_tokens: int) -> int:
        # A forked choice's own outputs, plus the copy of the shared partial block.
        return self.kv.blocks_for(max_tokens) + 1
