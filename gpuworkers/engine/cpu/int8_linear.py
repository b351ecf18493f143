"""Weight-only int8 linears on the compiled tile kernels (``amx_linear_int8``
and ``dpbf16_linear_int8``; engine/quantization.py quantizes, and falls
back to torch's op where these do not run).

The int8 weights are packed in the bfloat16 tile layout (``pack_tiles``,
one byte per weight); the kernels widen each thread's chunk to bfloat16
(exact for |q| <= 127) and run the bfloat16 tiles over it, and the
epilogue multiplies each column's float32 sum by its scale before the
bias. So a row's bits, as with bfloat16 weights, depend on its own inputs
only.
"""

from __future__ import annotations

import torch
from torch import nn

from gpuworkers.engine.cpu.tile_linear import (
    TILE_COLUMNS,
    AmxLinear,
    Dpbf16Linear,
    TileLinear,
    alternate_halves,
    pack_tiles,
    run_tiles,
    tile_linear_kind,
)
from gpuworkers.engine.quantization import quantize_int8


class Int8TileLinear(nn.Module):
    """``y = x @ (q * scales).T + b`` for bfloat16 rows, q int8 packed in
    column tiles; with ``swiglu``, q is [gate; up] (no bias) and ``y =
    silu(x @ gate.T) * (x @ up.T)``. Subclasses name the entry points."""

    bf16_kind: type[TileLinear] = TileLinear
    name = linear_entry = swiglu_entry = ""
    rows_are_independent = True

    def __init__(self, lib, linear: nn.Linear, swiglu: bool = False):
        super().__init__()
        # (Asking also gets the process AMX's permission before a tile runs.)
        if not self.applies(lib, linear.in_features):
            raise ValueError(f"{self.name} int8 linears do not run here or take this input width")
        if swiglu and not self.applies_swiglu(lib, linear):
            raise ValueError("swiglu needs a bias-free linear with a multiple of 32 outputs")
        self.lib = lib
        self.swiglu = swiglu
        self.in_features = linear.in_features
        self.out_features = linear.out_features // 2 if swiglu else linear.out_features
        quantized, scales = quantize_int8(linear.weight)
        packed = pack_tiles(quantized)
        # Per column in the tiles' order, padding columns 0.
        tile_scales = scales.new_zeros(packed.shape[0], TILE_COLUMNS)
        tile_scales.view(-1)[: scales.numel()] = scales
        if swiglu:
            packed, tile_scales = alternate_halves(packed), alternate_halves(tile_scales)
        self.register_buffer("packed_weight", packed, persistent=False)
        self.register_buffer("scales", tile_scales.contiguous(), persistent=False)
        bias = linear.bias.detach().float().contiguous() if linear.bias is not None else None
        self.register_buffer("bias", bias, persistent=False)
        self._linear = getattr(lib, self.linear_entry)
        self._swiglu = getattr(lib, self.swiglu_entry)

    @classmethod
    def applies(cls, lib, in_features: int) -> bool:
        return cls.bf16_kind.applies(lib, in_features)

    @classmethod
    def applies_swiglu(cls, lib, linear: nn.Linear) -> bool:
        return cls.bf16_kind.applies_swiglu(lib, linear)

    def weight_pointers(self) -> tuple[int, ...]:
        """The int8 tiles and their per-column scales, as the entry points take them."""
        return (self.packed_weight.data_ptr(), self.scales.data_ptr())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype != torch.bfloat16:
            raise TypeError(f"{type(self).__name__} takes bfloat16 rows, not {x.dtype}")
        return run_tiles(self, x)


class Int8AmxLinear(Int8TileLinear):
    bf16_kind, name = AmxLinear, AmxLinear.name
    linear_entry, swiglu_entry = "amx_linear_int8", "amx_swiglu_int8"


class Int8Dpbf16Linear(Int8TileLinear):
    bf16_kind, name = Dpbf16Linear, Dpbf16Linear.name
    linear_entry, swiglu_entry = "dpbf16_linear_int8", "dpbf16_swiglu_int8"


INT8_KINDS = {AmxLinear: Int8AmxLinear, Dpbf16Linear: Int8Dpbf16Linear}


def int8_tile_linear_kind(lib) -> type[Int8TileLinear] | None:
    """The int8 tile linear for this machine's bfloat16 one (tile_linear_kind:
    AMX first, else vdpbf16ps); None without either, or with
    GPUWORKERS_TILE_LINEARS=0."""
    kind = tile_linear_kind(lib)
    return INT8_KINDS[kind] if kind is not None else None
