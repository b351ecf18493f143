"""The compiled CPU decode kernel and the pre-packed linears.

The kernel is checked against plain softmax attention over the same keys
and values, computed densely in float32, and against the backend's own
gather path; the packed linears against ``F.linear``.
"""

from __future__ import annotations

import random

import pytest
import torch
import torch.nn.functional as F

from gpuworkers.engine.attention.torch_backend import TorchAttentionBackend
from gpuworkers.engine.attention.torch_metadata import TorchAttentionMetadata
from gpuworkers.engine.cpu import build
from gpuworkers.engine.cpu.packing import PackedLinear, pack_linears, packing_available
from gpuworkers.engine.cpu.paged_decode import PagedDecodeKernel
from gpuworkers.engine.cpu.tile_linear import AmxLinear, tile_linear_kind


def random_pool(num_heads, num_kv_heads, head_dim, block_size, lens, dtype, seed=0):
    """A shuffled pool holding one sequence per entry of ``lens``."""
    rng = random.Random(seed)
    gen = torch.Generator().manual_seed(seed)
    num_blocks = sum(-(-n // block_size) for n in lens) + 3
    shape = (num_blocks, num_kv_heads, head_dim * block_size)
    k_cache = torch.randn(shape, generator=gen).to(dtype)
    v_cache = torch.randn(shape, generator=gen).to(dtype)
    free = list(range(num_blocks))
    rng.shuffle(free)
    tables = []
    for n in lens:
        count = -(-n // block_size)
        tables.append([free.pop() for _ in range(count)])
    width = max(len(t) for t in tables)
    padded = torch.tensor([t + [0] * (width - len(t)) for t in tables])
    q = torch.randn(len(lens), num_heads, head_dim, generator=gen).to(dtype)
    return q, k_cache, v_cache, padded, torch.tensor(lens)


def dense_reference(q, k_cache, v_cache, tables, lens, num_kv_heads, head_dim, block_size):
    """Softmax attention in float32, one sequence at a time, from the pool."""
    blocks = k_cache.shape[0]
    keys = k_cache.float().view(blocks, num_kv_heads, head_dim, block_size)
    values = v_cache.float().view(blocks, num_kv_heads, block_size, head_dim)
    group = q.shape[1] // num_kv_heads
    outs = []
    for i, n in enumerate(lens.tolist()):
        table = tables[i, : -(-n // block_size)]
        k = keys[table].permute(1, 0, 3, 2).reshape(num_kv_heads, -1, head_dim)[:, :n]
        v = values[table].transpose(0, 1).reshape(num_kv_heads, -1, head_dim)[:, :n]
        k = k.repeat_interleave(group, 0)
        v = v.repeat_interleave(group, 0)
        scores = (q[i].float()[:, None, :] @ k.transpose(1, 2)) * head_dim**-0.5
        outs.append((scores.softmax(-1) @ v)[:, 0])
    return torch.stack(outs)


@pytest.mark.parametrize(
    ("num_heads", "num_kv_heads", "head_dim", "block_size"),
    [(9, 3, 64, 16), (8, 8, 64, 16), (16, 2, 128, 32), (4, 1, 64, 16)],
)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_kernel_matches_dense_attention(
    library, num_heads, num_kv_heads, head_dim, block_size, dtype
):
    # Lengths on and off block boundaries, including a single key.
    lens = [1, block_size, block_size + 1, 3 * block_size - 1, 200, 77]
    q, k_cache, v_cache, tables, kv_lens = random_pool(
        num_heads, num_kv_heads, head_dim, block_size, lens, dtype
    )
    kernel = PagedDecodeKernel(library, num_heads, num_kv_heads, head_dim, block_size)
    assert kernel.supports(dtype, torch.device("cpu"))
    backend = TorchAttentionBackend(num_heads, num_kv_heads, head_dim, block_size)
    keys, values = backend._views(k_cache, v_cache)
    out = kernel(q, keys, values, tables, kv_lens)
    expected = dense_reference(
        q, k_cache, v_cache, tables, kv_lens, num_kv_heads, head_dim, block_size
    )
    tolerance = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(out.float(), expected, atol=tolerance, rtol=tolerance)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_kernel_rows_can_share_tables_and_keep_their_bits(library, dtype):
    """Deterministic steps' rows: several query rows read one table
    (``table_rows``) with their own lengths; each row's bits equal that row
    computed alone, whatever else is in the call."""
    lens = [40, 7, 33]
    q, k_cache, v_cache, tables, _ = random_pool(9, 3, 64, 16, lens, dtype)
    kernel = PagedDecodeKernel(library, 9, 3, 64, 16)
    keys, values = TorchAttentionBackend(9, 3, 64, 16)._views(k_cache, v_cache)
    rows = torch.tensor([0, 0, 0, 1, 2, 2])
    row_lens = torch.tensor([1, 17, 40, 7, 32, 33])
    queries = torch.randn(6, 9, 64, generator=torch.Generator().manual_seed(3)).to(dtype)
    together = kernel.bind(tables, row_lens, rows)(queries, keys, values)
    for i in range(6):
        table = tables[rows[i] : rows[i] + 1]
        alone = kernel(queries[i : i + 1], keys, values, table, row_lens[i : i + 1])
        assert torch.equal(together[i], alone[0]), f"row {i}"
    expected = dense_reference(queries, k_cache, v_cache, tables[rows], row_lens, 3, 64, 16)
    tolerance = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(together.float(), expected, atol=tolerance, rtol=tolerance)


@pytest.mark.parametrize(
    ("num_heads", "num_kv_heads", "head_dim", "block_size"), [(9, 3, 64, 16), (16, 2, 128, 32)]
)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shared_rows", [False, True])
def test_kernel_reads_blocks_once_for_rows_over_one_sequence_and_keeps_their_bits(
    library, num_heads, num_kv_heads, head_dim, block_size, dtype, shared_rows
):
    """Verification rows (lengths L..L+k over one sequence's blocks) are
    processed together, each block read once for all of them; each row's
    bits still equal that row computed alone. The rows' tables are copies
    (the metadata's verifications) or one shared table (``table_rows``);
    runs longer than a group, shorter rows after longer ones and a
    neighbour with other blocks are included."""
    lens = [70, 5, 3 * block_size + 1]
    q, k_cache, v_cache, tables, _ = random_pool(
        num_heads, num_kv_heads, head_dim, block_size, lens, dtype, seed=4
    )
    kernel = PagedDecodeKernel(library, num_heads, num_kv_heads, head_dim, block_size)
    backend = TorchAttentionBackend(num_heads, num_kv_heads, head_dim, block_size)
    keys, values = backend._views(k_cache, v_cache)
    # Sequence 0: 11 rows (more than one group); 1: alone; 2: decreasing.
    row_seqs = [0] * 11 + [1] + [2] * 4
    row_lens = [60 + j for j in range(11)] + [5, 49, 48, 33, 1]
    rows = torch.tensor(row_seqs)
    row_lens = torch.tensor(row_lens)
    gen = torch.Generator().manual_seed(5)
    queries = torch.randn(len(row_seqs), num_heads, head_dim, generator=gen).to(dtype)
    if shared_rows:
        together = kernel.bind(tables, row_lens, rows)(queries, keys, values)
    else:
        together = kernel(queries, keys, values, tables[rows], row_lens)
    for i, seq in enumerate(row_seqs):
        table = tables[seq : seq + 1]
        alone = kernel(queries[i : i + 1], keys, values, table, row_lens[i : i + 1])
        assert torch.equal(together[i], alone[0]), f"row {i}"
    expected = dense_reference(
        queries, k_cache, v_cache, tables[rows], row_lens, num_kv_heads, head_dim, block_size
    )
    tolerance = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(together.float(), expected, atol=tolerance, rtol=tolerance)


@pytest.mark.parametrize(
    ("num_heads", "num_kv_heads", "head_dim", "block_size"), [(9, 3, 64, 16), (16, 2, 128, 32)]
)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_kernel_rows_of_a_large_batch_keep_their_bits(
    library, num_heads, num_kv_heads, head_dim, block_size, dtype
):
    """A batch with many sequences per thread is split into work items of
    all kv heads of a sequence, a lone sequence into one item per kv head:
    each row's bits are the same either way."""
    rng = random.Random(6)
    lens = [rng.randint(1, 300) for _ in range(4 * torch.get_num_threads() + 3)]
    q, k_cache, v_cache, tables, kv_lens = random_pool(
        num_heads, num_kv_heads, head_dim, block_size, lens, dtype, seed=6
    )
    kernel = PagedDecodeKernel(library, num_heads, num_kv_heads, head_dim, block_size)
    keys, values = TorchAttentionBackend(num_heads, num_kv_heads, head_dim, block_size)._views(
        k_cache, v_cache
    )
    together = kernel(q, keys, values, tables, kv_lens)
    for i in range(len(lens)):
        alone = kernel(q[i : i + 1], keys, values, tables[i : i + 1], kv_lens[i : i + 1])
        assert torch.equal(together[i], alone[0]), f"row {i}"
    expected = dense_reference(
        q, k_cache, v_cache, tables, kv_lens, num_kv_heads, head_dim, block_size
    )
    tolerance = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(together.float(), expected, atol=tolerance, rtol=tolerance)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_backend_kernel_and_gather_paths_agree(library, dtype):
    """The same decode batch through the backend with and without the kernel:
    each sequence's new key and value written at its last slot (the kernel's
    write_kv vs torch's index_put), then attended to."""
    lens = [5, 40, 41, 300, 16, 1000, 2, 64]
    q, k_cache, v_cache, tables, kv_lens = random_pool(9, 3, 64, 16, lens, dtype, seed=1)
    # The new tokens' k and v as views into one fused row, as the model has them.
    gen = torch.Generator().manual_seed(2)
    fused_row = torch.randn(len(lens), 9 * 64 + 2 * 3 * 64, generator=gen).to(dtype)
    new_k = fused_row[:, 9 * 64 : 12 * 64].view(-1, 3, 64)
    new_v = fused_row[:, 12 * 64 :].view(-1, 3, 64)
    last = kv_lens - 1
    slots = tables.gather(1, (last // 16)[:, None])[:, 0] * 16 + last % 16
    outputs, pools = {}, {}
    for use_kernel in (True, False):
        backend = TorchAttentionBackend(9, 3, 64, 16, use_kernel=use_kernel)
        meta = TorchAttentionMetadata(
            num_decodes=len(lens),
            slot_mapping=slots,
            decode_block_tables=tables,
            decode_kv_lens=kv_lens,
        )
        backend.metadata_builder.plan(meta, dtype)
        assert (meta.decode_kernel is not None) == use_kernel
        assert bool(meta.decode_groups) != use_kernel
        pool_k, pool_v = k_cache.clone(), v_cache.clone()
        outputs[use_kernel] = backend.forward(q, new_k, new_v, pool_k, pool_v, meta)
        pools[use_kernel] = (pool_k, pool_v)
    assert torch.equal(pools[True][0], pools[False][0])
    assert torch.equal(pools[True][1], pools[False][1])
    assert not torch.equal(pools[True][0], k_cache), "no key was written"
    tolerance = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(
        outputs[True].float(), outputs[False].float(), atol=tolerance, rtol=0
    )


def test_kernel_refuses_shapes_it_was_not_built_for(library):
    # head_dim 80 has no instantiation: the backend must keep the gather path.
    kernel = PagedDecodeKernel(library, 8, 8, 80, 16)
    assert not kernel.supports(torch.float32, torch.device("cpu"))
    assert not PagedDecodeKernel(library, 8, 8, 64, 16).supports(torch.float16, torch.device("cpu"))
    backend = TorchAttentionBackend(8, 8, 80, 16)
    meta = TorchAttentionMetadata(
        num_decodes=1,
        slot_mapping=torch.zeros(0, dtype=torch.long),
        decode_block_tables=torch.tensor([[0]]),
        decode_kv_lens=torch.tensor([3]),
    )
    backend.metadata_builder.plan(meta, torch.float32)
    assert meta.decode_kernel is None and len(meta.decode_groups) == 1


def test_loading_the_library_keeps_subnormal_floats(library):
    """The kernels are compiled with -ffast-math but must not switch the
    process to flush-to-zero (what linking with -ffast-math does)."""
    smallest = 5e-324
    assert smallest * 1.0 == smallest
    assert (torch.tensor([1e-40]) * 1.0).item() > 0


def test_build_is_cached_per_machine_and_can_be_switched_off(monkeypatch, tmp_path):
    monkeypatch.setenv(build.ENV_CACHE, str(tmp_path))
    compiler = build._compiler()
    assert compiler is not None
    first = build._build(compiler)
    assert first.parent == tmp_path and first.exists()
    stamp = first.stat().st_mtime_ns
    assert build._build(compiler) == first
    assert first.stat().st_mtime_ns == stamp, "a cached build was rebuilt"
    assert not list(tmp_path.glob("*partial*")), "a partial build was left behind"
    monkeypatch.setenv(build.ENV_SWITCH, "0")
    assert build.cpu_library() is None


@pytest.mark.skipif(
    not packing_available(torch.bfloat16, "cpu"), reason="this torch build has no oneDNN packing"
)
@pytest.mark.parametrize("rows", [1, 7, 64, 700])
def test_packed_linear_is_bit_identical_to_f_linear(rows):
    gen = torch.Generator().manual_seed(rows)
    linear = torch.nn.Linear(576, 960, bias=True)
    with torch.no_grad():
        linear.weight.copy_(torch.randn(960, 576, generator=gen))
        linear.bias.copy_(torch.randn(960, generator=gen))
    linear = linear.to(torch.bfloat16)
    x = torch.randn(rows, 576, generator=gen).to(torch.bfloat16)
    packed = PackedLinear(linear)
    assert torch.equal(packed(x), F.linear(x, linear.weight, linear.bias))
    # Leading dimensions pass through.
    assert packed(x.view(1, rows, 576)).shape == (1, rows, 960)


def test_pack_linears_swaps_every_linear():
    model = torch.nn.Sequential(
        torch.nn.Linear(64, 32, bias=False), torch.nn.ReLU(), torch.nn.Linear(32, 8)
    ).to(torch.bfloat16)
    if not packing_available(torch.bfloat16, "cpu"):
        pytest.skip("this torch build has no oneDNN packing")
    x = torch.randn(5, 64).to(torch.bfloat16)
    expected = model(x)
    assert pack_linears(model) == 2
    assert not any(isinstance(m, torch.nn.Linear) for m in model.modules())
    assert torch.equal(model(x), expected)


def test_bfloat16_engine_answers_the_demo_question_on_both_paths(demo_dir):
    """End to end in bfloat16: fast paths on (kernels, packing) and off."""
    from gpuworkers.engine import LLMEngine, SamplingParams
    from tokenization.tokenizer import apply_chat_template

    for fast in (True, False):
        engine = LLMEngine.from_pretrained(
            demo_dir, dtype="bfloat16", kv_cache_bytes=64 << 20, cpu_fast_paths=fast
        )
        assert bool(engine.runner.model.cpu_fast_paths) == fast
        backend = engine.runner.backend
        assert (backend.kernel is not None) == fast
        # The prefill kernel needs AVX512_BF16; without it prefills keep SDPA.
        prefill = fast and backend.prefill_kernel.supports(torch.bfloat16, torch.device("cpu"))
        expected = ["paged-decode-kernel"] + ["prefill-attention-kernel"] * prefill
        # The demo model's linears all fit the tile kernels, its gate_up the
        # fused SwiGLU too; with neither AMX nor AVX512_BF16, oneDNN, whose
        # bfloat16 packing needs AVX512 or AVX-NE-CONVERT (an AVX2-only EPYC
        # keeps plain linears).
        kind = tile_linear_kind(build.cpu_library())
        tile = None if kind is None else "amx" if kind is AmxLinear else "dpbf16"
        if tile:
            expected += [f"{tile}-linears", f"{tile}-swiglu"]
        elif packing_available(torch.bfloat16, "cpu"):
            expected += ["packed-linears"]
        # With tile linears, pure decode steps run the compiled layer loop.
        expected += ["fused-elementwise"] + ["decode-layers"] * bool(tile)
        assert engine.cpu_fast_paths == (expected if fast else [])
        prompt = apply_chat_template(
            engine.tokenizer, [{"role": "user", "content": "What is the capital of France?"}]
        )
        (out,) = engine.generate([prompt], SamplingParams(max_tokens=16, temperature=0.0))
        assert "Paris" in out.text
        assert engine.stats()["kv_blocks_used"] == 0
