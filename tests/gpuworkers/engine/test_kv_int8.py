"""The int8 KV cache (``kv_cache_dtype="int8"``).

Quantization is checked against its error bound; decode attention over an
int8 pool against float32 attention over the same pool dequantized (on the
compiled kernel and the torch gather path, writes included); the engine
against the default engine's greedy output, under swapping, the prefix
cache and copy-on-write; the pool sizing against the bytes it is given.
"""

from __future__ import annotations

import pytest
import torch

from gpuworkers.engine import EngineConfig, SamplingParams
from gpuworkers.engine.attention import kv_int8, select_backend
from gpuworkers.engine.attention.torch_backend import TorchAttentionBackend
from gpuworkers.engine.attention.torch_metadata import PrefillSpan, TorchAttentionMetadata
from gpuworkers.engine.cpu.paged_decode import PagedDecodeKernel
from gpuworkers.engine.models.config import ModelConfig

from .test_cpu_fast_paths import dense_reference, random_pool

# Few prompts and tokens: each engine run here is a full generation.
GREEDY = SamplingParams(max_tokens=16, temperature=0.0)
PROMPTS = 4


def test_quantized_rows_come_back_within_half_a_step():
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(64, 3, 64, generator=gen) * torch.rand(64, 3, 1, generator=gen) * 10
    x[5, 1] = 0.0  # a row of zeros: scale 0, no division by zero
    quantized, scales = kv_int8.quantize_rows(x)
    assert quantized.dtype == torch.int8 and scales.shape == (64, 3)
    assert quantized.abs().max() == 127
    back = quantized.float() * scales.unsqueeze(-1)
    # Round to nearest: at most half a quantization step per element.
    assert ((back - x).abs() <= scales.unsqueeze(-1) / 2 + 1e-6).all()
    assert scales[5, 1] == 0 and (quantized[5, 1] == 0).all()
    # Each row's largest magnitude is exact.
    peak = x.abs().amax(-1)
    torch.testing.assert_close(back.abs().amax(-1), peak)


def int8_pool(num_heads, num_kv_heads, head_dim, block_size, lens, dtype, seed=0):
    """random_pool's sequences in an int8 pool, and that pool dequantized
    into float32 in random_pool's layout (the reference's input)."""
    q, k_float, v_float, tables, kv_lens = random_pool(
        num_heads, num_kv_heads, head_dim, block_size, lens, dtype, seed
    )
    blocks = k_float.shape[0]
    backend = TorchAttentionBackend(
        num_heads, num_kv_heads, head_dim, block_size, use_kernel=False, kv_cache_dtype="int8"
    )
    shape = (blocks, *backend.cache_block_shape())
    k_cache, v_cache = torch.zeros(shape, dtype=torch.int8), torch.zeros(shape, dtype=torch.int8)
    keys, values = backend._views(k_cache, v_cache)
    key_scales, value_scales = backend._scales(k_cache, v_cache)
    # Quantize per (token, kv head): keys are [head_dim, block] per head.
    float_keys = k_float.float().view(blocks, num_kv_heads, head_dim, block_size)
    float_values = v_float.float().view(blocks, num_kv_heads, block_size, head_dim)
    quantized, scales = kv_int8.quantize_rows(float_keys.transpose(2, 3))
    keys.copy_(quantized.transpose(2, 3))
    key_scales.copy_(scales)
    quantized, scales = kv_int8.quantize_rows(float_values)
    values.copy_(quantized)
    value_scales.copy_(scales)
    k_deq = kv_int8.dequantize_keys(keys, key_scales, torch.float32).reshape(k_float.shape)
    v_deq = kv_int8.dequantize_values(values, value_scales, torch.float32).reshape(v_float.shape)
    return backend, q, (k_cache, v_cache), (k_deq, v_deq), tables, kv_lens


@pytest.mark.parametrize(
    ("num_heads", "num_kv_heads", "head_dim", "block_size"),
    [(9, 3, 64, 16), (8, 8, 64, 16), (16, 2, 128, 32)],
)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("use_kernel", [True, False])
def test_int8_decode_matches_float_attention_on_the_dequantized_pool(
    request, num_heads, num_kv_heads, head_dim, block_size, dtype, use_kernel
):
    """The compiled kernel (its AVX-512 instances where the CPU has them,
    else the portable ones) and the torch gather path."""
    lens = [1, block_size, block_size + 1, 3 * block_size - 1, 200, 77]
    backend, q, pool, dequantized, tables, kv_lens = int8_pool(
        num_heads, num_kv_heads, head_dim, block_size, lens, dtype
    )
    keys, values = backend._views(*pool)
    if use_kernel:
        kernel = PagedDecodeKernel(
            request.getfixturevalue("library"),
            num_heads,
            num_kv_heads,
            head_dim,
            block_size,
            kv_int8=True,
        )
        assert kernel.supports(dtype, torch.device("cpu"))
        out = kernel(q, keys, values, tables, kv_lens)
    else:
        meta = TorchAttentionMetadata(
            num_decodes=len(lens),
            slot_mapping=torch.zeros(0, dtype=torch.long),
            decode_block_tables=tables,
            decode_kv_lens=kv_lens,
        )
        backend.metadata_builder.plan(meta, dtype)
        assert meta.decode_kernel is None and meta.decode_groups
        out = torch.empty_like(q)
        for group in meta.decode_groups:
            rows = slice(group.start, group.end)
            out[rows] = backend._decode(q[rows], keys, values, backend._scales(*pool), group)
    expected = dense_reference(q, *dequantized, tables, kv_lens, num_kv_heads, head_dim, block_size)
    tolerance = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(out.float(), expected, atol=tolerance, rtol=tolerance)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_backend_int8_kernel_and_torch_paths_agree_writes_included(library, dtype):
    """A decode batch through the backend with and without the compiled
    kernel: each sequence's new key and value quantized into its last slot
    (the kernel's write vs torch's), then attended to."""
    lens = [5, 40, 41, 300, 16, 1000, 2, 64]
    _, q, pool, _, tables, kv_lens = int8_pool(9, 3, 64, 16, lens, dtype, seed=1)
    gen = torch.Generator().manual_seed(2)
    fused_row = torch.randn(len(lens), 9 * 64 + 2 * 3 * 64, generator=gen).to(dtype)
    new_k = fused_row[:, 9 * 64 : 12 * 64].view(-1, 3, 64)
    new_v = fused_row[:, 12 * 64 :].view(-1, 3, 64)
    last = kv_lens - 1
    slots = tables.gather(1, (last // 16)[:, None])[:, 0] * 16 + last % 16
    outputs, pools = {}, {}
    for use_kernel in (True, False):
        backend = TorchAttentionBackend(9, 3, 64, 16, use_kernel, kv_cache_dtype="int8")
        meta = TorchAttentionMetadata(
            num_decodes=len(lens),
            slot_mapping=slots,
            decode_block_tables=tables,
            decode_kv_lens=kv_lens,
        )
        backend.metadata_builder.plan(meta, dtype)
        assert (meta.decode_kernel is not None) == use_kernel
        pool_k, pool_v = pool[0].clone(), pool[1].clone()
        outputs[use_kernel] = backend.forward(q, new_k, new_v, pool_k, pool_v, meta)
        pools[use_kernel] = backend, pool_k, pool_v
    assert not torch.equal(pools[True][1], pool[0]), "no key was written"
    # Both writes quantize alike: data within one step (the compiled one
    # may round a product differently), scales to float32 rounding.
    kernel_side, torch_side = pools[True], pools[False]
    kernel_views = kernel_side[0]._views(*kernel_side[1:])
    data = zip(kernel_views, torch_side[0]._views(*torch_side[1:]), strict=True)
    for a, b in data:
        assert (a.int() - b.int()).abs().max() <= 1
    kernel_scales = kernel_side[0]._scales(*kernel_side[1:])
    scales = zip(kernel_scales, torch_side[0]._scales(*torch_side[1:]), strict=True)
    for a, b in scales:
        torch.testing.assert_close(a, b, rtol=1e-6, atol=0)
    # The new token's dequantized key is within half a step of the written one.
    backend = kernel_side[0]
    keys, _ = backend._views(*kernel_side[1:])
    key_scales, _ = backend._scales(*kernel_side[1:])
    blocks, offsets = slots // 16, slots % 16
    written = keys[blocks, :, :, offsets].float() * key_scales[blocks, :, offsets].unsqueeze(-1)
    step = key_scales[blocks, :, offsets].unsqueeze(-1)
    assert ((written - new_k.float()).abs() <= step / 2 + 1e-3 * step + 1e-6).all()
    tolerance = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(
        outputs[True].float(), outputs[False].float(), atol=tolerance, rtol=0
    )


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_int8_prefill_after_cached_context_reads_the_dequantized_pool(dtype):
    """A chunk after cached context (a prefix-cache hit) attends to the
    context and its own keys, both read back from the int8 pool."""
    context, chunk = 40, 9
    backend, _, pool, dequantized, tables, kv_lens = int8_pool(
        9, 3, 64, 16, [context + chunk], dtype, seed=3
    )
    assert backend.prefill_kernel is None  # the bfloat16 kernel reads bfloat16 pools only
    gen = torch.Generator().manual_seed(4)
    q = torch.randn(chunk, 9, 64, generator=gen).to(dtype)
    table = tables[0, : -(-(context + chunk) // 16)]
    span = PrefillSpan(query_start=0, query_len=chunk, context_len=context, block_table=table)
    out = torch.empty_like(q)
    keys, values = backend._views(*pool)
    backend._attend_after_context(q, keys, values, backend._scales(*pool), span, out)
    # Query i sees keys [0, context + i]: the decode reference, one row each.
    rows_q = q
    row_tables = table.expand(chunk, -1)
    row_lens = torch.arange(context + 1, context + chunk + 1)
    expected = dense_reference(rows_q, *dequantized, row_tables, row_lens, 3, 64, 16)
    tolerance = 1e-5 if dtype == torch.float32 else 3e-2
    torch.testing.assert_close(out.float(), expected, atol=tolerance, rtol=tolerance)


def agreement(a: list[int], b: list[int]) -> float:
    """The share of ``b``'s tokens that ``a`` reproduces before they first differ."""
    same = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        same += 1
    return same / max(len(b), 1)


def greedy(engine, prompts, params=GREEDY) -> dict[str, list[int]]:
    outputs = {f"r{i}": [] for i in range(len(prompts))}
    for i, ids in enumerate(prompts):
        engine.add_request(f"r{i}", ids, params)
    steps = 0
    while engine.has_unfinished_requests():
        for out in engine.step():
            for choice in out.choices:
                key = out.request_id if choice.index == 0 else f"{out.request_id}/{choice.index}"
                outputs.setdefault(key, []).extend(choice.token_ids)
        steps += 1
        assert steps < 2000, "engine made no progress"
    return outputs


@pytest.fixture(scope="module")
def prompts(chat_prompts):
    return chat_prompts[:PROMPTS]


@pytest.fixture(scope="module")
def default_outputs(make_engine, prompts):
    return greedy(make_engine(enable_prefix_caching=False), prompts)


@pytest.fixture(scope="module")
def int8_outputs(make_engine, prompts):
    """The int8 engine where no block moves (compiled kernels)."""
    engine = make_engine(kv_cache_dtype="int8", enable_prefix_caching=False)
    assert engine.runner.kv_cache.dtype == torch.int8
    assert engine.runner.backend.kernel is not None
    return greedy(engine, prompts)


def assert_mostly_agrees(outputs, reference):
    """Greedy int8 output follows the default engine's: a rounding of K/V
    can flip a near-tie late in a continuation, but broken kernels (wrong
    scales, wrong layout) diverge from the first tokens."""
    shares = [agreement(outputs[key], reference[key]) for key in reference]
    assert sum(shares) / len(shares) >= 0.6, shares
    assert sum(outputs[key][:4] == reference[key][:4] for key in reference) >= len(reference) - 1


def test_int8_engine_mostly_agrees_with_the_default_engine(int8_outputs, default_outputs):
    assert_mostly_agrees(int8_outputs, default_outputs)


def test_int8_engine_on_plain_torch_matches_the_kernels(make_engine, prompts, int8_outputs):
    """CPU fast paths off: the torch K/V write and the gather path."""
    engine = make_engine(kv_cache_dtype="int8", cpu_fast_paths=False, enable_prefix_caching=False)
    assert engine.runner.backend.kernel is None
    assert_mostly_agrees(greedy(engine, prompts), int8_outputs)


def test_int8_kv_survives_swapping_copy_on_write_and_the_prefix_cache(
    make_engine, prompts, int8_outputs
):
    """Blocks that move (swapped out and back, copied for n=2, served again
    from the prefix cache) carry their scales with them."""
    swapping = make_engine(
        kv_cache_dtype="int8", num_kv_blocks=7, num_host_blocks=64,
        admission_policy="optimistic", enable_prefix_caching=False,
    )  # fmt: skip
    # Swapped blocks come back bit for bit: the same tokens as where none moved.
    assert greedy(swapping, prompts) == int8_outputs
    stats = swapping.stats()
    assert stats["swaps_out"] > 0 and stats["swaps_in"] == stats["swaps_out"]

    cached = make_engine(kv_cache_dtype="int8", enable_prefix_caching=True)
    greedy(cached, prompts)
    both = greedy(cached, prompts, SamplingParams(max_tokens=16, temperature=0.0, n=2))
    assert cached.stats()["prefix_cache_hit_tokens"] > 0
    for i in range(len(prompts)):
        # The two choices share the prompt's blocks, the last one copied on write.
        assert both[f"r{i}"] == both[f"r{i}/1"]
    # A hit's chunk attends to the context read back from the pool, where
    # the first pass attended to its fresh K/V: close, not bit-equal.
    assert_mostly_agrees({key: both[key] for key in int8_outputs}, int8_outputs)


def test_an_int8_pool_holds_about_twice_the_tokens(demo_dir):
    model_cfg = ModelConfig.from_dir(demo_dir)
    budget = 64 << 20
    config = EngineConfig(dtype="bfloat16")
    default = config.kv_blocks_for(model_cfg.kv_bytes_per_token("bfloat16"), budget)
    int8 = config.kv_blocks_for(model_cfg.kv_bytes_per_token("bfloat16", "int8"), budget)
    # head_dim 64: 64 + 4 bytes per token and kv head against 128.
    assert 1.85 < int8 / default < 1.9
    per_token = 2 * model_cfg.num_layers * model_cfg.num_kv_heads * (model_cfg.head_dim + 4)
    assert model_cfg.kv_bytes_per_token("float32", "int8") == per_token
    # The pool the runner allocates is what was counted.
    backend = TorchAttentionBackend(
        model_cfg.num_heads, model_cfg.num_kv_heads, model_cfg.head_dim, 16, False, "int8"
    )
    block_bytes = 2 * model_cfg.num_layers * torch.Size(backend.cache_block_shape()).numel()
    assert block_bytes == per_token * 16


def test_bad_kv_cache_dtypes_are_refused_clearly():
    with pytest.raises(ValueError, match="unknown kv_cache_dtype 'fp8'.*'auto'.*'int8'"):
        EngineConfig(kv_cache_dtype="fp8")
    with pytest.raises(ValueError, match="needs the torch attention backend.*fp8"):
        EngineConfig(kv_cache_dtype="int8", attention_backend="flashinfer")
    with pytest.raises(ValueError, match="unknown kv_cache_dtype"):
        TorchAttentionBackend(9, 3, 64, 16, kv_cache_dtype="bfloat16")
    # "auto" on CUDA would pick FlashInfer; an int8 pool keeps torch.
    assert select_backend("auto", "cuda", kv_cache_dtype="int8").name == "torch"
