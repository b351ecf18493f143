"""Fixed-size KV blocks: free list, refcounts and the prefix-cache index.

Free blocks wait in one queue ordered for eviction: a block freed with a
hash stays findable by that hash (it is "cached") until it reaches the head
of the queue and is reused for something else. That makes the free queue the
LRU list of the prefix cache, as in vLLM v1's block pool.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from gpuworkers.engine.prefix_cache import BlockHash


class OutOfBlocks(RuntimeError):
    """No free block is left; the scheduler preempts to make room."""


@dataclass(slots=True)
class Block:
    block_id: int
    ref_count: int = 0
    block_hash: BlockHash | None = None


class BlockAllocator:
    """Device KV blocks with refcounts, copy-on-write sharing and LRU reuse."""

    def __init__(self, num_blocks: int, enable_caching: bool = True):
        if num_blocks < 1:
            raise ValueError("the KV pool needs at least one block")
        self.num_blocks = num_blocks
        self.enable_caching = enable_caching
        self.blocks = [Block(i) for i in range(num_blocks)]
        # Head: evicted first. Values unused; OrderedDict gives O(1) removal.
        self._free: OrderedDict[int, None] = OrderedDict((i, None) for i in range(num_blocks))
        self._cached: dict[BlockHash, int] = {}

    @property
    def num_free(self) -> int:
        """Blocks no sequence holds (cached ones included: they can be reused)."""
        return len(self._free)

    @property
    def num_used(self) -> int:
        return self.num_blocks - len(self._free)

    @property
    def num_cached(self) -> int:
        return len(self._cached)

    def allocate(self) -> int:
        """Take the least recently used free block, evicting its cache entry."""
        if not self._free:
            raise OutOfBlocks("no free KV blocks")
        block_id, _ = self._free.popitem(last=False)
        block = self.blocks[block_id]
        if block.block_hash is not None:
            # Eviction: the cached prefix in this block is gone.
            if self._cached.get(block.block_hash) == block_id:
                del self._cached[block.block_hash]
            block.block_hash = None
        block.ref_count = 1
        return block_id

    def free(self, block_id: int) -> None:
        """Drop one reference; the block joins the free queue at zero."""
        block = self.blocks[block_id]
        if block.ref_count <= 0:
            raise AssertionError(f"block {block_id} freed with ref_count {block.ref_count}")
        block.ref_count -= 1
        if block.ref_count == 0:
            self._free[block_id] = None
            if block.block_hash is None:
                # Nothing to find in it: reuse it before any cached block.
                self._free.move_to_end(block_id, last=False)

    def fork(self, block_id: int) -> None:
        """Share a held block with another sequence (copy-on-write)."""
        block = self.blocks[block_id]
        if block.ref_count <= 0:
            raise AssertionError(f"fork of free block {block_id}")
        block.ref_count += 1

    def ref_count(self, block_id: int) -> int:
        return self.blocks[block_id].ref_count

    def lookup(self, block_hash: BlockHash) -> int | None:
        """The block holding this hash's KV, if still cached."""
        if not self.enable_caching:
            return None
        return self._cached.get(block_hash)

    def acquire_cached(self, block_id: int) -> None:
        """Take a reference on a cache hit, pulling it off the free queue."""
        block = self.blocks[block_id]
        if block.ref_count == 0:
            del self._free[block_id]
        block.ref_count += 1

    def register(self, block_id: int, block_hash: BlockHash) -> None:
        """Record that a full block holds ``block_hash``'s KV (first one wins)."""
        if not self.enable_caching:
            return
        block = self.blocks[block_id]
        if block.block_hash is not None:
            return
        if block_hash in self._cached:
            # Same content computed twice concurrently: keep the first copy;
            # this one is released normally when its sequence ends.
            return
        block.block_hash = block_hash
        self._cached[block_hash] = block_id

    def check_invariants(self) -> None:
        """Consistency check used by tests: refcounts and free queue agree."""
        for block in self.blocks:
            assert block.ref_count >= 0, block
            assert (block.ref_count == 0) == (block.block_id in self._free), block
        for block_hash, block_id in self._cached.items():
            assert self.blocks[block_id].block_hash == block_hash


class HostBlockPool:
    """Block ids of the host-memory swap pool (plain free list, no caching)."""

    def __init__(self, num_blocks: int):
        self.num_blocks = num_blocks
        self._free = list(range(num_blocks - 1, -1, -1))

    @property
    def num_free(self) -> int:
        return len(self._free)

    def allocate(self, count: int) -> list[int]:
        if count > len(self._free):
            raise OutOfBlocks("host swap pool is full")
        taken = self._free[-count:] if count else []
        del self._free[len(self._free) - count :]
        return taken

    def free(self, block_ids: list[int]) -> None:
        self._free.extend(block_ids)
