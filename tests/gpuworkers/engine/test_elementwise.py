"""The fused bfloat16 element-wise ops (gpuworkers/engine/cpu/elementwise.*)
against the torch code they replace (models/layers.py)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from gpuworkers.engine.cpu.elementwise import FusedOps
from gpuworkers.engine.models.layers import RMSNorm, RotaryEmbedding


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
