"""The compiled prefill attention kernel (engine/cpu/prefill_attention.cpp).

Checked against causal softmax attention computed in float32 on the
upcast inputs, for whole prompts and chunks after context; each row's bits
against the same row computed in other chunkings; the torch backend with
the kernel against the backend with scaled_dot_product_attention.

Tolerance: inputs are bfloat16, products exact and sums float32 in both,
so the kernel differs from the float32 reference by its two roundings to
bfloat16 (relative 2^-9 each): the probabilities before P @ V, which moves
each output by at most 2^-9 * sum(p * |v|) <= 2^-9 * max|v| (~0.01 for
unit normal values, whose largest of a few thousand is ~4), and the
output itself (half a step: 2^-9 relative). atol = rtol = 2e-2 covers both
with room; observed: under 0.01.
"""

from __future__ import annotations

import random

import pytest
import torch

from gpuworkers.engine.attention import CommonAttentionMetadata
from gpuworkers.engine.attention.torch_backend import TorchAttentionBackend
from gpuworkers.engine.cpu import build
from gpuworkers.engine.cpu.prefill_attention import PrefillAttentionKernel

BF16 = torch.bfloat16
CPU = torch.device("cpu")
TOLERANCE = 2e-2


def kernel_for(library, heads, kv_heads, head_dim, block_size) -> PrefillAttentionKernel:
    kernel = PrefillAttentionKernel(library, heads, kv_heads, head_dim, block_size)
    if not kernel.supports(BF16, CPU):
        # Built without AVX512_BF16: the backend keeps SDPA (tested below).
        pytest.skip("this CPU has no AVX512_BF16: no compiled prefill kernel")
    return kernel


def random_sequence(kv_heads, head_dim, block_size, kv_len, seed=0):
    """A pool of random keys and values (unit normal, bfloat16) with one
    sequence of kv_len tokens in shuffled blocks, the last one partly
    filled; the slots past kv_len hold NaN, as nothing promises them zero."""
    gen = torch.Generator().manual_seed(seed)
    used = -(-kv_len // block_size)
    blocks = used + 3
    k_cache = torch.randn(blocks, kv_heads, head_dim, block_size, generator=gen).to(BF16)
    v_cache = torch.randn(blocks, kv_heads, block_size, head_dim, generator=gen).to(BF16)
    order = list(range(blocks))
    random.Random(seed).shuffle(order)
    table = torch.tensor(order[:used])
    tail = kv_len - (used - 1) * block_size
    k_cache[table[-1], :, :, tail:] = float("nan")
    v_cache[table[-1], :, tail:, :] = float("nan")
    return k_cache, v_cache, table


def dense_kv(k_cache, v_cache, table, kv_len):
    """The sequence's keys and values as [kv_heads, kv_len, dim], float32."""
    kv_heads, head_dim = k_cache.shape[1], k_cache.shape[2]
    keys = k_cache[table].permute(1, 0, 3, 2).reshape(kv_heads, -1, head_dim)[:, :kv_len]
    values = v_cache[table].transpose(0, 1).reshape(kv_heads, -1, head_dim)[:, :kv_len]
    return keys.float(), values.float()


def reference(q, keys, values):
    """Causal attention in float32: query i of q_len sees keys [0, kv_len - q_len + i]."""
    q_len, heads, head_dim = q.shape
    kv_len = keys.shape[1]
    group = heads // keys.shape[0]
    scores = torch.einsum("qhd,hkd->hqk", q.float(), keys.repeat_interleave(group, 0))
    limit = torch.arange(q_len)[:, None] + kv_len - q_len
    scores = scores.masked_fill(torch.arange(kv_len)[None, :] > limit, float("-inf"))
    probs = (scores * head_dim**-0.5).softmax(-1)
    return torch.einsum("hqk,hkd->qhd", probs, values.repeat_interleave(group, 0))


SHAPES = [(9, 3, 64, 16), (8, 8, 64, 16), (16, 2, 128, 32)]
# (q_len, kv_len): whole prompts on and off the kernel's tiles (64 keys, 32
# queries), then chunks after context whose offsets are not multiples of
# either, and single queries.
LENGTHS = [(1, 1), (7, 7), (63, 63), (64, 64), (65, 65), (414, 414), (1000, 1000)]
LENGTHS += [(1, 414), (7, 100), (65, 130), (333, 1000), (31, 97)]


@pytest.mark.parametrize(("heads", "kv_heads", "head_dim", "block_size"), SHAPES)
@pytest.mark.parametrize(("q_len", "kv_len"), LENGTHS)
def test_kernel_matches_float32_attention(
    library, heads, kv_heads, head_dim, block_size, q_len, kv_len
):
    kernel = kernel_for(library, heads, kv_heads, head_dim, block_size)
    k_cache, v_cache, table = random_sequence(kv_heads, head_dim, block_size, kv_len, seed=kv_len)
    gen = torch.Generator().manual_seed(q_len)
    # q as the model has it: a strided view into the fused qkv rows.
    fused = torch.randn(q_len, (heads + 2 * kv_heads) * head_dim, generator=gen).to(BF16)
    q = fused[:, : heads * head_dim].view(q_len, heads, head_dim)
    out = kernel(q, k_cache, v_cache, table, kv_len)
    assert out.dtype == BF16 and out.shape == q.shape
    expected = reference(q, *dense_kv(k_cache, v_cache, table, kv_len))
    torch.testing.assert_close(out.float(), expected, atol=TOLERANCE, rtol=TOLERANCE)


@pytest.mark.parametrize(("heads", "kv_heads", "head_dim", "block_size"), SHAPES)
def test_rows_are_bit_identical_in_any_chunking(library, heads, kv_heads, head_dim, block_size):
    """A row's result depends on its query, keys and position only: the same
    bits from the whole prompt in one call, from chunks after context (one
    query, odd offsets, a chunk longer than many query blocks, chunks that
    end mid row tile), and on one thread or two. Where AMX runs (rows in
    tiles of 16, padded; amx_linear_supported says so) as where vdpbf16ps
    does (tiles of 6)."""
    kernel = kernel_for(library, heads, kv_heads, head_dim, block_size)
    total = 414
    k_cache, v_cache, table = random_sequence(kv_heads, head_dim, block_size, total, seed=7)
    gen = torch.Generator().manual_seed(8)
    q = torch.randn(total, heads, head_dim, generator=gen).to(BF16)
    whole = kernel(q, k_cache, v_cache, table, total)
    chunks = [(0, 1), (1, 65), (65, 66), (66, 100), (100, 413), (413, 414), (5, 414)]
    for start, end in chunks + [(0, 16), (16, 33), (33, 37), (37, 53)]:
        chunk = kernel(q[start:end], k_cache, v_cache, table, end)
        assert torch.equal(chunk, whole[start:end]), f"chunk [{start}, {end})"
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        assert torch.equal(kernel(q, k_cache, v_cache, table, total), whole)
    finally:
        torch.set_num_threads(threads)


def test_kernel_refuses_what_it_was_not_built_for(library):
    """head_dim 80, other dtypes and q_len > kv_len: the backend keeps SDPA
    for the first two; the call itself refuses the last."""
    assert not PrefillAttentionKernel(library, 8, 8, 80, 16).supports(BF16, CPU)
    kernel = kernel_for(library, 9, 3, 64, 16)
    assert not kernel.supports(torch.float32, CPU)
    assert not kernel.supports(torch.float16, CPU)
    k_cache, v_cache, table = random_sequence(3, 64, 16, 20)
    q = torch.zeros(21, 9, 64, dtype=BF16)
    with pytest.raises(ValueError, match="q_len > kv_len"):
        kernel(q, k_cache, v_cache, torch.cat([table, table]), 20)
    with pytest.raises(ValueError, match="does not cover"):
        kernel(q[:5], k_cache, v_cache, table[:1], 20)


def step_with_prefills(backend, block_size, dtype, seed=0):
    """A decode row, a whole 50-token prompt and a 70-token chunk after 37
    cached tokens, in one step: the pool (context K/V from an earlier step),
    the step's q/k/v and its metadata."""
    gen = torch.Generator().manual_seed(seed)
    heads, kv_heads, head_dim = backend.num_heads, backend.num_kv_heads, backend.head_dim
    shape = (32, *backend.cache_block_shape())
    k_cache = torch.randn(shape, generator=gen).to(dtype)
    v_cache = torch.randn(shape, generator=gen).to(dtype)
    tables = [[3, 9], [4, 1, 12, 7], [30, 2, 5, 21, 6, 8, 11]]
    query_lens, context_lens = [1, 50, 70], [20, 0, 37]
    slots = [
        table[pos // block_size] * block_size + pos % block_size
        for table, start, n in zip(tables, context_lens, query_lens, strict=True)
        for pos in range(start, start + n)
    ]
    common = CommonAttentionMetadata(1, torch.tensor(slots), query_lens, context_lens, tables)
    tokens = sum(query_lens)
    q = torch.randn(tokens, heads, head_dim, generator=gen).to(dtype)
    k = torch.randn(tokens, kv_heads, head_dim, generator=gen).to(dtype)
    v = torch.randn(tokens, kv_heads, head_dim, generator=gen).to(dtype)
    return (k_cache, v_cache), (q, k, v), backend.metadata_builder.build(common, dtype)


def test_backend_prefill_kernel_agrees_with_sdpa(library):
    """The same bfloat16 step through the backend with the compiled kernels
    and with plain torch (SDPA for the prefills), compared in float32."""
    kernel_for(library, 9, 3, 64, 16)
    outputs = {}
    for use_kernel in (True, False):
        backend = TorchAttentionBackend(9, 3, 64, 16, use_kernel=use_kernel)
        assert (backend.prefill_kernel is not None) == use_kernel
        pool, (q, k, v), meta = step_with_prefills(backend, 16, BF16)
        assert [(s.query_len, s.context_len) for s in meta.prefills] == [(50, 0), (70, 37)]
        outputs[use_kernel] = backend.forward(q, k, v, *pool, meta).float()
    torch.testing.assert_close(outputs[True], outputs[False], atol=TOLERANCE, rtol=TOLERANCE)


@pytest.mark.parametrize(("head_dim", "dtype"), [(64, torch.float32), (80, BF16)])
def test_backend_keeps_sdpa_where_the_kernel_does_not_apply(library, monkeypatch, head_dim, dtype):
    """float32 (the parity tests' dtype) and shapes without a kernel go
    through SDPA: the prefill rows' bits are the plain torch backend's."""

    def refuse(*args, **kwargs):
        raise AssertionError("the prefill kernel was called")

    monkeypatch.setattr(PrefillAttentionKernel, "__call__", refuse)
    outputs = []
    for use_kernel in (True, False):
        backend = TorchAttentionBackend(4, 2, head_dim, 16, use_kernel=use_kernel)
        pool, (q, k, v), meta = step_with_prefills(backend, 16, dtype, seed=1)
        outputs.append(backend.forward(q, k, v, *pool, meta))
    assert torch.equal(outputs[0][1:], outputs[1][1:])


def test_no_prefill_kernel_when_cpu_kernels_are_off(monkeypatch):
    monkeypatch.setenv(build.ENV_SWITCH, "0")
    assert TorchAttentionBackend(9, 3, 64, 16).prefill_kernel is None
