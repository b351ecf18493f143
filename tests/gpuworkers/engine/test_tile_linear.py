"""The tile linears (gpuworkers/engine/cpu/tile_linear.py; amx_linear.cpp,
dpbf16_linear.cpp): each test runs for every kind this machine has."""

from __future__ import annotations

import functools

import pytest
import torch
import torch.nn.functional as F

from gpuworkers.engine.cpu import build
from gpuworkers.engine.cpu.elementwise import FusedOps
from gpuworkers.engine.cpu.packing import PackedLinear, pack_linears
from gpuworkers.engine.cpu.tile_linear import (
    AmxLinear,
    Dpbf16Linear,
    pack_tiles,
    tile_linear_kind,
)
from gpuworkers.engine.models.layers import MLP
from tests.gpuworkers.engine.linear_helpers import random_linear

LIB = build.cpu_library()


# An Intel Xeon with AMX runs both kinds (it has AVX512_BF16 too); an AMD
# EPYC Zen 4 the vdpbf16ps kind; a CPU with neither keeps oneDNN's packed
# linears and skips these.
@pytest.fixture(
    params=[
        pytest.param(AmxLinear, id="amx"),
        pytest.param(Dpbf16Linear, id="dpbf16"),
    ]
)
def kind(request):
    if not request.param.available(LIB):
        pytest.skip(f"this CPU's library has no {request.param.__name__} kernel")
    return request.param


layer = functools.partial(random_linear, dtype=torch.bfloat16)


def within_rounding(got: torch.Tensor, x: torch.Tensor, linear: torch.nn.Linear) -> bool:
    """Each output within bfloat16 rounding of the float32 product (the
    float32 sums themselves differ only in their order)."""
    bias = linear.bias.float() if linear.bias is not None else None
    exact = F.linear(x.float(), linear.weight.float(), bias)
    return bool(((got.float() - exact).abs() <= exact.abs() * 2.0**-8 + 1e-3).all())


def rows_of(count: int, features: int, seed: int) -> torch.Tensor:
    return torch.randn(count, features, generator=torch.Generator().manual_seed(seed)).to(
        torch.bfloat16
    )


@pytest.mark.parametrize("rows", [1, 5, 16, 17, 32, 33, 100])
@pytest.mark.parametrize(("out_features", "in_features"), [(960, 576), (40, 64), (200, 1536)])
@pytest.mark.parametrize("bias", [False, True])
def test_matches_float32_within_rounding_and_each_row_keeps_its_bits(
    kind, rows, out_features, in_features, bias
):
    linear = layer(out_features, in_features, bias, seed=rows + out_features)
    kernel = kind(LIB, linear)
    x = rows_of(rows, in_features, seed=rows)
    got = kernel(x)
    assert got.shape == (rows, out_features) and got.dtype == torch.bfloat16
    assert within_rounding(got, x, linear)
    # A row's bits are its own: alone, or in a batch cut elsewhere (full
    # 32-row blocks and tails alike).
    for row in {0, rows // 2, rows - 1}:
        assert torch.equal(kernel(x[row : row + 1]), got[row : row + 1])
    assert torch.equal(kernel(x[rows // 2 :]), got[rows // 2 :])


def test_a_prompt_whole_and_its_tail_alone_give_the_same_rows(kind):
    """What a prefix-cache hit does: the last tokens recomputed alone must
    match the same tokens computed with the whole prompt (oneDNN's rows
    differed between 17 and 300 rows on the AMX test machine)."""
    linear = layer(3072, 576, False, seed=11)
    kernel = kind(LIB, linear)
    prompt = rows_of(300, 576, seed=12)
    whole = kernel(prompt)
    for tail in (1, 13, 17, 44):
        assert torch.equal(kernel(prompt[-tail:]), whole[-tail:])


def test_rows_keep_their_bits_whatever_the_thread_count(kind):
    linear = layer(576, 1536, True, seed=3)
    kernel = kind(LIB, linear)
    x = rows_of(70, 1536, seed=4)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        alone = kernel(x)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(kernel(x), alone)


def test_reads_strided_rows_leading_dims_and_keeps_nan_in_its_row(kind):
    kernel = kind(LIB, layer(64, 64, False, seed=5))
    wide = rows_of(8, 128, seed=6)
    x = wide[:, 32:96]  # rows 128 apart, as the fused qkv views are
    assert torch.equal(kernel(x), kernel(x.contiguous()))
    assert torch.equal(kernel(x.contiguous().view(2, 4, 64)).view(8, 64), kernel(x))
    assert kernel(x[:0]).shape == (0, 64)
    x = x.contiguous()
    x[2, 7] = float("nan")
    got = kernel(x)
    assert got[2].isnan().all()
    assert not got[[0, 1, 3, 4, 5, 6, 7]].isnan().any()


def test_packing_puts_a_column_tiles_pairs_in_one_run():
    weight = torch.arange(20 * 4, dtype=torch.float32).view(20, 4).to(torch.bfloat16)
    tiles = pack_tiles(weight)
    assert tiles.shape == (2, 2, 16, 2)
    # Tile 0, input pair 1, column 3: weight[3, 2:4].
    assert torch.equal(tiles[0, 1, 3], weight[3, 2:4])
    # Columns past the weight's are zero.
    assert not tiles[1, :, 4:].any()


def test_pack_linears_takes_this_machines_kernel_where_the_shape_fits_and_onednn_elsewhere():
    kind = tile_linear_kind(LIB)
    if kind is None:
        pytest.skip("this CPU's library has no tile linear kernel")
    model = torch.nn.Sequential(
        torch.nn.Linear(64, 32, bias=False), torch.nn.ReLU(), torch.nn.Linear(47, 8)
    ).to(torch.bfloat16)
    assert pack_linears(model, LIB) == 2
    # 64 inputs fill AMX tiles (32 inputs a step) and vdpbf16ps pairs; 47 neither.
    assert isinstance(model[0], kind) and isinstance(model[2], PackedLinear)
    pack_linears(plain := torch.nn.Sequential(torch.nn.Linear(64, 32)).to(torch.bfloat16))
    assert isinstance(plain[0], PackedLinear)  # no library: oneDNN


@pytest.mark.parametrize("rows", [1, 17, 32, 100, 300])
@pytest.mark.parametrize(("width", "in_features"), [(1536, 576), (48, 64)])
def test_swiglu_gives_the_bits_of_gate_up_then_silu_and_mul(kind, rows, width, in_features):
    """The fused epilogue rounds as gate_up's bfloat16 output and the
    element-wise kernel do, so turning it on changes no logits."""
    linear = layer(2 * width, in_features, False, seed=rows + width)
    x = rows_of(rows, in_features, seed=rows)
    fused = kind(LIB, linear, swiglu=True)
    got = fused(x)
    assert got.shape == (rows, width) and fused.out_features == width
    assert torch.equal(got, FusedOps(LIB).silu_and_mul(kind(LIB, linear)(x)))
    gate, up = F.linear(x.float(), linear.weight.float()).split(width, dim=-1)
    assert torch.allclose(got.float(), F.silu(gate) * up, rtol=2e-2, atol=2e-2)
    # Rows keep their bits in any batch, as the plain kernel's do.
    assert torch.equal(fused(x[rows // 2 :]), got[rows // 2 :])


def test_swiglu_needs_a_bias_free_gate_up_with_whole_tile_pairs(kind):
    assert not kind.applies_swiglu(LIB, layer(64, 64, True, seed=1))
    assert not kind.applies_swiglu(LIB, layer(48, 64, False, seed=1))
    with pytest.raises(ValueError, match="swiglu"):
        kind(LIB, layer(48, 64, False, seed=1), swiglu=True)


def test_pack_linears_fuses_the_mlps_activation_into_gate_up():
    kind = tile_linear_kind(LIB)
    if kind is None:
        pytest.skip("this CPU's library has no tile linear kernel")
    mlp = MLP(hidden=64, intermediate=96).to(torch.bfloat16)
    x = rows_of(20, 64, seed=2)
    with torch.no_grad():
        gate, up = mlp.gate_up(x).split(96, dim=-1)
        unfused = mlp.down(F.silu(gate) * up)
    pack_linears(mlp, LIB)
    assert isinstance(mlp.gate_up, kind) and mlp.gate_up_activated
    assert mlp.gate_up.swiglu and not mlp.down.swiglu
    with torch.no_grad():
        got = mlp(x)
    assert got.shape == (20, 64)
    assert torch.allclose(got.float(), unfused.float(), rtol=5e-2, atol=5e-2)
