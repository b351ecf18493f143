"""What the compiled attention kernels share: the model's attention shape
and the torch backend's block pool layout."""

from __future__ import annotations


class PoolKernel:
    """A compiled attention kernel over the paged pool.

    The pool layout is the torch backend's: per block and kv head, keys as
    [head_dim, block_size] and values as [block_size, head_dim].
    """

    def __init__(self, lib, num_heads: int, num_kv_heads: int, head_dim: int, block_size: int):
        self.lib = lib
        self.num_heads = num_heads
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.block_size = block_size
        self.scale = head_dim**-0.5
        # Query heads per kv head; 0 where they do not divide (no kernel has that shape).
        self.group = num_heads // num_kv_heads if num_heads % num_kv_heads == 0 else 0
