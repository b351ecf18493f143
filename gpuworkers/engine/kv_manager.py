"""Per-sequence KV bookkeeping on top of the block allocator.

The scheduler talks to this class in tokens and sequences; block ids,
refcounts, copy-on-write and the prefix-cache index stay behind it.
"""

from __future__ import annotations

from gpuworkers.engine.block_allocator import BlockAllocator, HostBlockPool
from gpuworkers.engine.prefix_cache import hash_block, hash_full_blocks
from gpuworkers.engine.sequence import Sequence


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


class KVCacheManager:
    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        num_host_blocks: int = 0,
        enable_prefix_caching: bool = True,
        model_id: str = "",
    ):
        self.block_size = block_size
        self.model_id = model_id
        self.enable_prefix_caching = enable_prefix_caching
        self.allocator = BlockAllocator(num_blocks, enable_caching=enable_prefix_caching)
        self.host = HostBlockPool(num_host_blocks)
        self.prefix_hit_tokens = 0
        self.prefix_query_tokens = 0

    @property
    def num_free(self) -> int:
        return self.allocator.num_free

    @property
    def num_total(self) -> int:
        return self.allocator.num_blocks

    def blocks_for(self, num_tokens: int) -> int:
        return cdiv(num_tokens, self.block_size)

    # Prefix cache -----------------------------------------------------

    def match_prefix(self, seq: Sequence) -> list[int]:
        """Cached blocks holding ``seq``'s leading full blocks.

        At least one token is always left to compute: the last token's
        logits are needed to sample, so a fully cached prompt gives back its
        last block.
        """
        if not self.enable_prefix_caching:
            return []
        request = seq.request
        seq.block_hashes = hash_full_blocks(
            seq.token_ids,
            self.block_size,
            self.model_id,
            request.cache_salt,
            deterministic=request.params.deterministic,
        )
        if request.params.prompt_logprobs is not None:
            # Cached tokens have no logits: a request that wants every
            # prompt token's logprob computes its whole prompt (as vLLM).
            # Its hashes stay, so its own blocks still serve others.
            return []
        hits: list[int] = []
        for block_hash in seq.block_hashes:
            block_id = self.allocator.lookup(block_hash)
            if block_id is None:
                break
            hits.append(block_id)
        if hits and len(hits) * self.block_size >= seq.num_tokens:
            hits.pop()
        return hits

    def num_free_after_hits(self, hits: list[int]) -> int:
        """Free blocks left once ``hits`` are taken (idle hits leave the queue)."""
        idle = sum(1 for b in hits if self.allocator.ref_count(b) == 0)
        return self.allocator.num_free - idle

    def acquire_prefix(self, seq: Sequence, hits: list[int]) -> None:
        for block_id in hits:
            self.allocator.acquire_cached(block_id)
        seq.block_table = list(hits)
        seq.num_computed_tokens = len(hits) * self.block_size
        seq.num_cached_tokens = seq.num_computed_tokens
        self.prefix_hit_tokens += seq.num_computed_tokens
        self.prefix_query_tokens += seq.num_tokens

    def register_full_blocks(self, seq: Sequence, num_new_tokens: int) -> None:
        """Make the blocks that ``seq``'s last ``num_new_tokens`` computed
        tokens filled findable by hash.

        Only those: earlier blocks were registered when they filled, and
        going over every block every step cost O(length) per sequence.
        """
        self._register(seq, (seq.num_computed_tokens - num_new_tokens) // self.block_size)

    def _register(self, seq: Sequence, first: int) -> None:
        """Register ``seq``'s full blocks from index ``first`` on."""
        if not self.enable_prefix_caching:
            return
        num_full = seq.num_computed_tokens // self.block_size
        hashes = seq.block_hashes
        while len(hashes) < num_full:
            i = len(hashes)
            tokens = seq.token_ids[i * self.block_size : (i + 1) * self.block_size]
            parent = hashes[-1] if hashes else None
            request = seq.request
            hashes.append(
                hash_block(
                    parent, tokens, self.model_id, request.cache_salt, request.params.deterministic
                )
            )
        for i in range(max(first, 0), num_full):
            self.allocator.register(seq.block_table[i], hashes[i])

    # Growth -----------------------------------------------------------

    def blocks_to_append(self, seq: Sequence, num_new_tokens: int) -> int:
        """Device blocks needed to compute ``num_new_tokens`` more tokens."""
        needed = self.blocks_for(seq.num_computed_tokens + num_new_tokens) - len(seq.block_table)
        return max(needed, 0) + (1 if self._needs_cow(seq) else 0)

    def can_append(self, seq: Sequence, num_new_tokens: int) -> bool:
        return self.blocks_to_append(seq, num_new_tokens) <= self.allocator.num_free

    def append_slots(self, seq: Sequence, num_new_tokens: int) -> list[tuple[int, int]]:
        """Grow ``seq``'s table; returns (src, dst) block copies for copy-on-write."""
        copies: list[tuple[int, int]] = []
        if self._needs_cow(seq):
            index = seq.num_computed_tokens // self.block_size
            shared = seq.block_table[index]
            private = self.allocator.allocate()
            self.allocator.free(shared)
            seq.block_table[index] = private
            copies.append((shared, private))
        needed = self.blocks_for(seq.num_computed_tokens + num_new_tokens) - len(seq.block_table)
        for _ in range(needed):
            seq.block_table.append(self.allocator.allocate())
        return copies

    def trim(self, seq: Sequence) -> None:
        """Free ``seq``'s blocks past its computed tokens: those a
        verification took for drafts it rejected (fresh, never registered)."""
        keep = self.blocks_for(seq.num_computed_tokens)
        while len(seq.block_table) > keep:
            self.allocator.free(seq.block_table.pop())

    def _needs_cow(self, seq: Sequence) -> bool:
        """The next token lands in a partial block shared with a sibling."""
        offset = seq.num_computed_tokens % self.block_size
        index = seq.num_computed_tokens // self.block_size
        if offset == 0 or index >= len(seq.block_table):
            return False
        return self.allocator.ref_count(seq.block_table[index]) > 1

    def fork(self, parent: Sequence, child: Sequence) -> None:
        """Give ``child`` the parent's blocks, shared until one of them writes."""
        for block_id in parent.block_table:
            self.allocator.fork(block_id)
        child.block_table = list(parent.block_table)
        child.block_hashes = list(parent.block_hashes)
        child.num_computed_tokens = parent.num_computed_tokens
        child.num_cached_tokens = parent.num_cached_tokens

    def free(self, seq: Sequence) -> None:
        """Release every block of ``seq``, device and host."""
        # Tail blocks first, so a prefix's deepest blocks are evicted first.
        for block_id in reversed(seq.block_table):
            self.allocator.free(block_id)
        seq.block_table = []
        if seq.host_block_table:
            self.host.free(seq.host_block_table)
            seq.host_block_table = []

    # Swapping ---------------------------------------------------------

    def can_swap_out(self, seq: Sequence) -> bool:
        return 0 < len(seq.block_table) <= self.host.num_free

    def swap_out(self, seq: Sequence) -> list[tuple[int, int]]:
        """Move ``seq``'s KV to host blocks; returns (device, host) copies."""
        host_blocks = self.host.allocate(len(seq.block_table))
        mapping = list(zip(seq.block_table, host_blocks, strict=True))
        for block_id in reversed(seq.block_table):
            self.allocator.free(block_id)
        seq.block_table = []
        seq.host_block_table = host_blocks
        return mapping

    def can_swap_in(self, seq: Sequence, extra_tokens: int = 1) -> bool:
        need = len(seq.host_block_table) + max(
            self.blocks_for(seq.num_computed_tokens + extra_tokens) - len(seq.host_block_table), 0
        )
        return need <= self.allocator.num_free

    def swap_in(self, seq: Sequence) -> list[tuple[int, int]]:
        """Bring ``seq``'s KV back; returns (host, device) copies."""
        device_blocks = [self.allocator.allocate() for _ in seq.host_block_table]
        mapping = list(zip(seq.host_block_table, device_blocks, strict=True))
        self.host.free(seq.host_block_table)
        seq.host_block_table = []
        seq.block_table = device_blocks
        # New device blocks: findable again (the runner copies them in
        # before this step's forward pass reads any of them).
        self._register(seq, 0)
        return mapping
