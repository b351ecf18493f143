"""Block allocator and prefix-cache index, with tiny pools and no model."""

import pytest

from gpuworkers.engine.block_allocator import BlockAllocator, HostBlockPool, OutOfBlocks
from gpuworkers.engine.prefix_cache import hash_block, hash_full_blocks


def test_allocate_free_returns_every_block():
    allocator = BlockAllocator(4)
    blocks = [allocator.allocate() for _ in range(4)]
    assert allocator.num_free == 0
    with pytest.raises(OutOfBlocks):
        allocator.allocate()
    for block in blocks:
        allocator.free(block)
    assert allocator.num_free == 4
    allocator.check_invariants()


def test_refcount_never_goes_negative():
    allocator = BlockAllocator(2)
    block = allocator.allocate()
    allocator.fork(block)
    allocator.free(block)
    assert allocator.ref_count(block) == 1
    allocator.free(block)
    with pytest.raises(AssertionError):
        allocator.free(block)
    assert allocator.ref_count(block) == 0


def test_cached_block_is_found_until_evicted_lru():
    allocator = BlockAllocator(3)
    a, b = allocator.allocate(), allocator.allocate()
    allocator.register(a, b"hash-a")
    allocator.register(b, b"hash-b")
    allocator.free(a)  # freed first: least recently used
    allocator.free(b)
    assert allocator.lookup(b"hash-a") == a
    # The never-cached block is reused before any cached one.
    first = allocator.allocate()
    assert first not in (a, b)
    assert allocator.lookup(b"hash-a") == a
    second = allocator.allocate()
    assert second == a, "the least recently freed cached block is evicted first"
    assert allocator.lookup(b"hash-a") is None
    assert allocator.lookup(b"hash-b") == b
    allocator.check_invariants()


def test_acquiring_a_cached_block_takes_it_off_the_free_queue():
    allocator = BlockAllocator(2)
    a = allocator.allocate()
    allocator.register(a, b"h")
    allocator.free(a)
    assert allocator.num_free == 2
    allocator.acquire_cached(a)
    assert allocator.num_free == 1 and allocator.ref_count(a) == 1
    allocator.check_invariants()


def test_chained_hashes_depend_on_prefix_model_and_salt():
    tokens = list(range(32))
    base = hash_full_blocks(tokens, 16, "m", None)
    assert len(base) == 2
    assert hash_full_blocks(tokens + [1, 2, 3], 16, "m", None) == base  # partial block ignored
    other_first = hash_full_blocks([99] + tokens[1:], 16, "m", None)
    assert other_first[1] != base[1], "a block's hash covers everything before it"
    assert hash_full_blocks(tokens, 16, "other-model", None)[0] != base[0]
    assert hash_full_blocks(tokens, 16, "m", "tenant-a")[0] != base[0]
    assert hash_block(None, tokens[:16], "m", None) == base[0]


def test_host_pool_allocates_and_frees():
    pool = HostBlockPool(3)
    taken = pool.allocate(2)
    assert len(set(taken)) == 2 and pool.num_free == 1
    with pytest.raises(OutOfBlocks):
        pool.allocate(2)
    pool.free(taken)
    assert pool.num_free == 3
