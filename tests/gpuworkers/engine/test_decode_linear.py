"""The AMX linear for decode-sized batches (gpuworkers/engine/cpu/decode_linear.*)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from gpuworkers.engine.cpu import build
from gpuworkers.engine.cpu.decode_linear import DecodeLinear, decode_linear_available, pack_tiles
from gpuworkers.engine.cpu.packing import PackedLinear, packing_available

LIB = build.cpu_library()

# Machines without AMX (the AMD EPYC CI hosts seen so far) build the
# library without this kernel and keep oneDNN for every row count.
pytestmark = pytest.mark.skipif(
    not decode_linear_available(LIB) or not packing_available(torch.bfloat16, "cpu"),
    reason="needs AMX (AMX_TILE and AMX_BF16) and oneDNN packing",
)


def layer(out_features: int, in_features: int, bias: bool, seed: int) -> torch.nn.Linear:
    gen = torch.Generator().manual_seed(seed)
    linear = torch.nn.Linear(in_features, out_features, bias=bias)
    with torch.no_grad():
        linear.weight.copy_(torch.randn(out_features, in_features, generator=gen))
        if bias:
            linear.bias.copy_(torch.randn(out_features, generator=gen))
    return linear.to(torch.bfloat16)


def within_rounding(got: torch.Tensor, x: torch.Tensor, linear: torch.nn.Linear) -> bool:
    """Each output within bfloat16 rounding of the float32 product (the
    float32 sums themselves differ only in their order)."""
    bias = linear.bias.float() if linear.bias is not None else None
    exact = F.linear(x.float(), linear.weight.float(), bias)
    return bool(((got.float() - exact).abs() <= exact.abs() * 2.0**-8 + 1e-3).all())


@pytest.mark.parametrize("rows", [1, 5, 16, 17, 24, 32])
@pytest.mark.parametrize(("out_features", "in_features"), [(960, 576), (40, 64), (200, 1536)])
@pytest.mark.parametrize("bias", [False, True])
def test_matches_float32_within_rounding_and_each_row_keeps_its_bits(
    rows, out_features, in_features, bias
):
    linear = layer(out_features, in_features, bias, seed=rows + out_features)
    kernel = DecodeLinear(LIB, linear.weight, linear.bias)
    x = torch.randn(rows, in_features, generator=torch.Generator().manual_seed(rows)).to(
        torch.bfloat16
    )
    got = kernel(x)
    assert got.shape == (rows, out_features) and got.dtype == torch.bfloat16
    assert within_rounding(got, x, linear)
    # A row's bits are its own: alone, or first of a smaller batch.
    for row in {0, rows // 2, rows - 1}:
        assert torch.equal(kernel(x[row : row + 1]), got[row : row + 1])
    assert torch.equal(kernel(x[rows // 2 :]), got[rows // 2 :])


def test_rows_keep_their_bits_whatever_the_thread_count():
    linear = layer(576, 1536, True, seed=3)
    kernel = DecodeLinear(LIB, linear.weight, linear.bias)
    x = torch.randn(24, 1536, generator=torch.Generator().manual_seed(4)).to(torch.bfloat16)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        alone = kernel(x)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(kernel(x), alone)


def test_reads_strided_rows_and_keeps_nan_in_its_row():
    linear = layer(64, 64, False, seed=5)
    kernel = DecodeLinear(LIB, linear.weight, None)
    wide = torch.randn(8, 128, generator=torch.Generator().manual_seed(6)).to(torch.bfloat16)
    x = wide[:, 32:96]  # rows 128 apart, as the fused qkv views are
    assert torch.equal(kernel(x), kernel(x.contiguous()))
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


def test_packed_linear_sends_decode_rows_to_the_kernel_and_the_rest_to_onednn():
    linear = layer(960, 576, True, seed=7)
    packed = PackedLinear(linear, LIB)
    assert packed.decode is not None
    x = torch.randn(200, 576, generator=torch.Generator().manual_seed(8)).to(torch.bfloat16)
    small = x[: packed.decode.max_rows]
    assert torch.equal(packed(small), packed.decode(small))
    assert torch.equal(packed(x), F.linear(x, linear.weight, linear.bias))
    assert packed(x[:0]).shape == (0, 960)
    # Without the library, or inputs the tiles cannot cover, oneDNN only.
    assert PackedLinear(linear).decode is None
    assert PackedLinear(layer(8, 48, False, seed=9), LIB).decode is None
