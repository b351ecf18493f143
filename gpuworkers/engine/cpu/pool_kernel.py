"""What the compiled attention kernels share: the model's attention shape
and the torch backend's block pool layout."""

from __future__ import annotations


class PoolKernel:
    """A compiled attention kernel over the paged pool.

    The pool layout is the torch backend's: per block and kv head, keys as
    [head_dim, block_size] and values as [block_size, head_dim], in an int8
    pool followed by a float32 scale per token (attention/kv_int8.py).
    """

    def __init__(
        self,
        lib,
        num_heads: int,
        num_kv_heads: int,
        head_dim: int,
        block_size: int,
        kv_int8: bool = False,
    ):
        self.lib = lib
        self.num_heads = num_heads
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.block_size = block_size
        self.kv_int8 = kv_int8
        self.scale = head_dim**-0.5
        # Query heads per kv head; 0 where they do not divide (no kernel has that shape).
        self.group = num_heads // num_kv_heads if num_heads % num_kv_heads == 0 else 0
        # Elements (bytes in an int8 pool) from one kv head of a block to the next.
        self.head_stride = head_dim * block_size + (4 * block_size if kv_int8 else 0)

    def check_pool(self, k_cache, v_cache) -> None:
        """K and V views ([blocks, kv_heads, ...]) laid out as the kernels read them."""
        if k_cache.stride()[:2] != v_cache.stride()[:2] or k_cache.stride()[1:] != (
            self.head_stride,
            self.block_size,
            1,
        ):
            raise ValueError("K and V pools must share block and head strides")
