"""KV and slot arithmetic: what a sequence holds, may still need, and
whether starting it now fits under the admission policy.

Shared by the scheduler (admission, swap-in) and the fair policy (a
tier's footprint), so that both count blocks the same way.
"""

from __future__ import annotations

from gpuworkers.engine.config import AdmissionPolicy, EngineConfig
from gpuworkers.engine.kv_manager import KVCacheManager
from gpuworkers.engine.sequence import Sequence


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
        params = seq.request.params
        return self.kv.blocks_for(
            min(seq.num_prompt_tokens + params.max_tokens, self.max_model_len)
        )

    def reserved_blocks(self, seq: Sequence) -> int:
        """Blocks ``seq`` may still need to reach its longest possible length."""
        return max(self.final_blocks(seq) - len(seq.block_table), 0)

    def future_growth(self, running: list[Sequence]) -> int:
        """Blocks the running sequences may still take, forks to come included."""
        growth = sum(self.reserved_blocks(s) for s in running)
        for seq in running:
            request = seq.request
            # Choices not forked yet grow from the shared prompt on their own.
            if seq is request.seqs[0] and not request.forked and request.params.n > 1:
                growth += (request.params.n - 1) * self._per_choice(request.params.max_tokens)
        return growth

    def footprint(self, seq: Sequence) -> int:
        """KV a sequence holds or, queued, will hold: its whole reservation
        under RESERVE (what it keeps others from using), else its size."""
        if self.config.admission_policy is AdmissionPolicy.RESERVE:
            return self.final_blocks(seq)
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
        params = seq.request.params
        needed = self.final_blocks(seq) - len(hits)
        if params.n > 1:
            needed += (params.n - 1) * self._per_choice(params.max_tokens)
        return needed + self.future_growth(running) <= free_after_hits

    def swap_in_fits(self, seq: Sequence, num_new: int, running: list[Sequence]) -> bool:
        """Whether a swapped ``seq`` may come back and compute ``num_new`` tokens."""
        if len(running) >= self.config.max_num_seqs:
            return False
        if not self.kv.can_swap_in(seq, num_new):
            return False
        if self.config.admission_policy is AdmissionPolicy.RESERVE:
            need = len(seq.host_block_table) + self.reserved_blocks(seq)
            return need + self.future_growth(running) <= self.kv.num_free
        return True

    def _per_choice(self, max_tokens: int) -> int:
        # A forked choice's own outputs, plus the copy of the shared partial block.
        return self.kv.blocks_for(max_tokens) + 1
