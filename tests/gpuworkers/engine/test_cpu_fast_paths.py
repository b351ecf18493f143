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
from gpuworkers.engine.cpu.amx_linear import amx_linear_available
from gpuworkers.engine.cpu.elementwise import FusedOps
from gpuworkers.engine.cpu.packing import PackedLinear, pack_linears, packing_available
from gpuworkers.engine.cpu.paged_decode import PagedDecodeKernel
from gpuworkers.engine.models.layers import RMSNorm, RotaryEmbedding


@pytest.fixture(scope="module")
def library():
    lib = build.cpu_library()
    # gcc is on every machine kind this project runs on (see README); a
    # missing compiler here is a set-up fault worth failing on, not skipping.
    assert lib is not None, "the CPU decode kernel did not build"
    return lib


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


# Fused element-wise ops -------------------------------------------------


def bf16_ulps(a: torch.Tensor, b: torch.Tensor) -> int:
    """Largest distance in bfloat16 steps between same-signed values."""
    as_int = lambda t: t.view(torch.int16).to(torch.int32)  # noqa: E731
    return int((as_int(a) - as_int(b)).abs().max())


@pytest.fixture(scope="module")
def fused(library):
    return FusedOps(library)


def test_fused_rms_norm_matches_torch_and_adds_the_residual_in_place(fused):
    gen = torch.Generator().manual_seed(3)
    norm = RMSNorm(576, 1e-5)
    with torch.no_grad():
        norm.weight.copy_(torch.rand(576, generator=gen) + 0.5)
    norm = norm.to(torch.bfloat16)
    x = torch.randn(37, 576, generator=gen).to(torch.bfloat16)
    residual = torch.randn(37, 576, generator=gen).to(torch.bfloat16)
    expected_sum = residual + x
    expected = norm(expected_sum)  # plain torch: fused is not attached
    assert bf16_ulps(fused.rms_norm(expected_sum, norm.weight, norm.eps), expected) <= 1
    stream = residual.clone()
    out = fused.rms_norm(x, norm.weight, norm.eps, residual=stream)
    assert torch.equal(stream, expected_sum)
    assert bf16_ulps(out, expected) <= 1


def test_fused_rotary_matches_torch_on_strided_heads(fused):
    gen = torch.Generator().manual_seed(4)
    rotary = RotaryEmbedding(64, 4096, 10000.0, {}, torch.bfloat16)
    # q and k as the model has them: views into one fused qkv row.
    qkv = torch.randn(20, 9 * 64 + 2 * 3 * 64, generator=gen).to(torch.bfloat16)
    q = qkv[:, : 9 * 64].view(20, 9, 64)
    k = qkv[:, 9 * 64 : 12 * 64].view(20, 3, 64)
    positions = torch.randint(0, 4096, (20,), generator=gen)
    expected_q, expected_k = rotary(positions, q.clone(), k.clone())
    value = qkv[:, 12 * 64 :].clone()
    separate = qkv.clone()
    fused.rotary_(separate[:, : 9 * 64].view(20, 9, 64), positions, rotary.cos, rotary.sin)
    fused.rotary_(separate[:, 9 * 64 : 12 * 64].view(20, 3, 64), positions, rotary.cos, rotary.sin)
    # Through the module: adjacent q and k views are rotated in one call.
    rotary.fused = fused
    q, k = rotary(positions, q, k)
    for rotated in (separate, qkv):
        assert torch.equal(rotated[:, : 9 * 64].view(20, 9, 64), expected_q)
        assert torch.equal(rotated[:, 9 * 64 : 12 * 64].view(20, 3, 64), expected_k)
        assert torch.equal(rotated[:, 12 * 64 :], value), "the rotation wrote past k"


def test_fused_silu_and_mul_matches_torch(fused):
    gen = torch.Generator().manual_seed(5)
    gate_up = (torch.randn(33, 2 * 1536, generator=gen) * 4).to(torch.bfloat16)
    gate, up = gate_up.split(1536, dim=-1)
    expected = F.silu(gate) * up
    # exp() differs in its last bit between libraries: one bfloat16 step in
    # silu, at most one more once multiplied by up and rounded.
    assert bf16_ulps(fused.silu_and_mul(gate_up), expected) <= 2


@pytest.fixture
def two_threads():
    """The kernels split large calls across torch's OpenMP pool."""
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(before)


def _random_bf16(gen, *shape, scale=1.0):
    return (torch.randn(*shape, generator=gen) * scale).to(torch.bfloat16)


# Row counts on both sides of the kernels' serial/parallel thresholds
# (8192 elements: 14/15 rows of 576, 10/11 rows of 12 x 64; silu 4096: 2/3
# rows of 1536).
@pytest.mark.parametrize("rows", [1, 2, 3, 10, 11, 14, 15, 37])
def test_fused_ops_give_each_row_the_bits_it_gets_alone(fused, two_threads, rows):
    gen = torch.Generator().manual_seed(rows)
    weight = _random_bf16(gen, 576) + 1
    x = _random_bf16(gen, rows, 576)
    residual = _random_bf16(gen, rows, 576)
    stream = residual.clone()
    normed = fused.rms_norm(x, weight, 1e-5, residual=stream)
    plain = fused.rms_norm(x, weight, 1e-5)
    gate_up = _random_bf16(gen, rows, 2 * 1536, scale=4)
    silu = fused.silu_and_mul(gate_up)
    rotary = RotaryEmbedding(64, 4096, 10000.0, {}, torch.bfloat16)
    heads = _random_bf16(gen, rows, 12, 64)
    positions = torch.randint(0, 4096, (rows,), generator=gen)
    rotated = fused.rotary_(heads.clone(), positions, rotary.cos, rotary.sin)
    for r in range(rows):
        alone = residual[r : r + 1].clone()
        assert torch.equal(
            fused.rms_norm(x[r : r + 1], weight, 1e-5, residual=alone), normed[r : r + 1]
        )
        assert torch.equal(alone, stream[r : r + 1])
        assert torch.equal(fused.rms_norm(x[r : r + 1], weight, 1e-5), plain[r : r + 1])
        assert torch.equal(fused.silu_and_mul(gate_up[r : r + 1]), silu[r : r + 1])
        one = fused.rotary_(heads[r : r + 1].clone(), positions[r : r + 1], rotary.cos, rotary.sin)
        assert torch.equal(one, rotated[r : r + 1])


@pytest.mark.parametrize("width", [1, 31, 33, 100])
def test_fused_ops_handle_widths_that_are_not_vector_multiples(fused, width):
    gen = torch.Generator().manual_seed(width)
    norm = RMSNorm(width, 1e-5).to(torch.bfloat16)
    with torch.no_grad():
        norm.weight.copy_(torch.rand(width, generator=gen) + 0.5)
    x, residual = _random_bf16(gen, 5, width), _random_bf16(gen, 5, width)
    expected = norm(residual + x)
    stream = residual.clone()
    assert bf16_ulps(fused.rms_norm(x, norm.weight, norm.eps, residual=stream), expected) <= 1
    assert torch.equal(stream, residual + x)
    gate_up = _random_bf16(gen, 5, 2 * width, scale=4)
    gate, up = gate_up.split(width, dim=-1)
    assert bf16_ulps(fused.silu_and_mul(gate_up), F.silu(gate) * up) <= 2


@pytest.mark.parametrize("head_dim", [2, 48, 80, 128])
def test_fused_rotary_handles_head_dims_that_are_not_vector_multiples(fused, head_dim):
    gen = torch.Generator().manual_seed(head_dim)
    rotary = RotaryEmbedding(head_dim, 512, 10000.0, {}, torch.bfloat16)
    q, k = _random_bf16(gen, 7, 3, head_dim), _random_bf16(gen, 7, 1, head_dim)
    positions = torch.randint(0, 512, (7,), generator=gen)
    expected_q, expected_k = rotary(positions, q, k)
    assert torch.equal(fused.rotary_(q.clone(), positions, rotary.cos, rotary.sin), expected_q)
    assert torch.equal(fused.rotary_(k.clone(), positions, rotary.cos, rotary.sin), expected_k)


def test_fused_ops_keep_nan_and_subnormals_and_silu_extremes(fused):
    gen = torch.Generator().manual_seed(6)
    # Subnormal bfloat16 in and out: vcvtneps2bf16 would flush them to 0.
    tiny = _random_bf16(gen, 4, 2, 64, scale=1e-39)
    rotary = RotaryEmbedding(64, 64, 10000.0, {}, torch.bfloat16)
    positions = torch.arange(4)
    tiny[1, 0, 5] = float("nan")
    expected, _ = rotary(positions, tiny, tiny[:, :1])
    assert (expected[0] != 0).any() and expected[0].abs().max() < 1.2e-38
    got = fused.rotary_(tiny.clone(), positions, rotary.cos, rotary.sin)
    assert torch.equal(got.isnan(), expected.isnan()) and got.isnan().any()
    assert torch.equal(got.nan_to_num(), expected.nan_to_num())

    x = _random_bf16(gen, 3, 100)
    x[1, 7] = float("nan")
    weight = torch.ones(100, dtype=torch.bfloat16)
    normed = fused.rms_norm(x, weight, 1e-5)
    assert normed[1].isnan().all() and not normed[[0, 2]].isnan().any()

    # exp(-g) overflows below -88.72: silu is -0 there (the division by inf
    # once came out NaN), and NaN stays NaN.
    gate = torch.tensor(
        [-1e4, -200.0, -100.0, -89.0, -20.0, 0.0, 3.0, 100.0, float("inf"), float("nan")]
    )
    gate_up = torch.cat([gate, torch.full_like(gate, 2.0)]).to(torch.bfloat16)[None]
    expected = F.silu(gate.to(torch.bfloat16)) * 2
    got = fused.silu_and_mul(gate_up)[0]
    assert torch.equal(got.isnan(), expected.isnan())
    assert torch.equal(got[:-1].view(torch.int16), expected[:-1].view(torch.int16))


def test_bfloat16_engine_answers_the_demo_question_on_both_paths(demo_dir):
    """End to end in bfloat16: fast paths on (kernels, packing) and off."""
    from gpuworkers.engine import LLMEngine, SamplingParams
    from gpuworkers.engine.tokenizer import apply_chat_template

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
        # The demo model's linears all fit AMX tiles; without AMX, oneDNN.
        amx = amx_linear_available(build.cpu_library())
        expected += ["amx-linears" if amx else "packed-linears", "fused-elementwise"]
        assert engine.cpu_fast_paths == (expected if fast else [])
        prompt = apply_chat_template(
            engine.tokenizer, [{"role": "user", "content": "What is the capital of France?"}]
        )
        (out,) = engine.generate([prompt], SamplingParams(max_tokens=16, temperature=0.0))
        assert "Paris" in out.text
        assert engine.stats()["kv_blocks_used"] == 0
