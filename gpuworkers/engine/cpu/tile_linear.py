"""Linear layers on compiled bfloat16 kernels that read the weight packed
in 16-column tiles, any number of rows: AMX (amx_linear.cpp) on Intel CPUs
that have it, else AVX512_BF16's vdpbf16ps (dpbf16_linear.cpp, AMD EPYC
Zen 4).

They replace oneDNN's packed linears (packing.py). With AMX, a decode
step's few rows read the weights at 20-25 GB/s where oneDNN read 15-18
(``python -m bench.decode_linear``); with vdpbf16ps, 24 rows ran the demo
model's linears at about 1.37x oneDNN's speed on the AMD EPYC test machine
(same command). And a row's bits do not depend on how many rows share the
call, so a prompt computed whole and its tail recomputed after a
prefix-cache hit give the same logits.

A SwiGLU MLP's gate_up linear can also apply ``silu(gate) * up`` as it
writes its rows (``swiglu=True``): the same bits as gate_up followed by the
element-wise silu_and_mul, without the [rows, 2 * width] intermediate.
"""

from __future__ import annotations

import os

import torch
from torch import nn

# "0" keeps oneDNN's packed linears where a tile kernel would run (the
# other kernels stay): for comparing the two, or a way back if one misbehaves.
ENV_SWITCH = "GPUWORKERS_TILE_LINEARS"

# A packed tile: 16 output columns by the input pairs (an AMX B tile is 16
# of those pairs; a vdpbf16ps operand is one).
TILE_COLUMNS = 16


class TileLinear(nn.Module):
    """``y = x @ W.T + b`` for bfloat16 rows, W packed in column tiles; with
    ``swiglu``, W is [gate; up] (no bias) and ``y = silu(x @ gate.T) * (x @ up.T)``.
    Subclasses name the library's entry points and their fast path."""

    name = supported_entry = k_multiple_entry = linear_entry = swiglu_entry = ""
    # A row's bits never depend on the call's other rows (each output is its
    # own dot product in input order): deterministic steps need no row tiles.
    rows_are_independent = True

    def __init__(self, lib, linear: nn.Linear, swiglu: bool = False):
        super().__init__()
        if swiglu and not self.applies_swiglu(lib, linear):
            raise ValueError("swiglu needs a bias-free linear with a multiple of 32 outputs")
        self.lib = lib
        self.swiglu = swiglu
        self.in_features = linear.in_features
        self.out_features = linear.out_features // 2 if swiglu else linear.out_features
        weight = pack_tiles(linear.weight.detach().to(torch.bfloat16))
        if swiglu:
            weight = alternate_halves(weight)
        self.register_buffer("packed_weight", weight, persistent=False)
        bias = linear.bias.detach().float().contiguous() if linear.bias is not None else None
        self.register_buffer("bias", bias, persistent=False)
        self._linear = getattr(lib, self.linear_entry)
        self._swiglu = getattr(lib, self.swiglu_entry)

    @classmethod
    def available(cls, lib) -> bool:
        return lib is not None and bool(getattr(lib, cls.supported_entry)())

    @classmethod
    def applies(cls, lib, in_features: int) -> bool:
        """Available, and ``in_features`` a multiple of the kernel's input step."""
        return cls.available(lib) and in_features % getattr(lib, cls.k_multiple_entry)() == 0

    @classmethod
    def applies_swiglu(cls, lib, linear: nn.Linear) -> bool:
        """Whether ``linear`` (rows [gate; up]) can run with ``swiglu``."""
        return (
            cls.applies(lib, linear.in_features)
            and linear.bias is None
            and linear.out_features % (2 * TILE_COLUMNS) == 0
        )

    def weight_pointers(self) -> tuple[int, ...]:
        """The packed weight as the entry points take it, before the bias."""
        return (self.packed_weight.data_ptr(),)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return run_tiles(self, x)


def run_tiles(module: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """``x``'s bfloat16 rows through ``module``'s entry points (a tile
    linear, bfloat16 or int8: ``module.weight_pointers()`` are what its
    kernels take between the input width and the bias)."""
    rows = x if x.dim() == 2 else x.reshape(-1, module.in_features)
    if rows.stride(-1) != 1:
        rows = rows.contiguous()
    out = torch.empty((rows.shape[0], module.out_features), dtype=torch.bfloat16)
    head = (rows.data_ptr(), rows.shape[0], rows.stride(0), module.in_features)
    if rows.shape[0] and module.swiglu:
        module._swiglu(*head, *module.weight_pointers(), out.data_ptr(), module.out_features)
    elif rows.shape[0]:
        bias = module.bias.data_ptr() if module.bias is not None else None
        module._linear(*head, *module.weight_pointers(), bias, out.data_ptr(), module.out_features)
    return out if x.dim() == 2 else out.view(*x.shape[:-1], module.out_features)


class AmxLinear(TileLinear):
    """On AMX tiles: 32 inputs per tile step, 16 rows per tile product."""

    name, supported_entry, k_multiple_entry = "amx", "amx_linear_supported", "amx_linear_k_multiple"
    linear_entry, swiglu_entry = "amx_linear_bf16", "amx_swiglu_bf16"


class Dpbf16Linear(TileLinear):
    """On AVX512_BF16's vdpbf16ps: two inputs per instruction, 12 rows per block."""

    name, supported_entry = "dpbf16", "dpbf16_linear_supported"
    k_multiple_entry = "dpbf16_linear_k_multiple"
    linear_entry, swiglu_entry = "dpbf16_linear_bf16", "dpbf16_swiglu_bf16"


def tile_linear_kind(lib) -> type[TileLinear] | None:
    """The tile linear this machine's library runs: AMX first, else vdpbf16ps;
    None without either, or with GPUWORKERS_TILE_LINEARS=0."""
    if os.environ.get(ENV_SWITCH, "1") == "0":
        return None
    for kind in (AmxLinear, Dpbf16Linear):
        if kind.available(lib):
            return kind
    return None


def pack_tiles(weight: torch.Tensor) -> torch.Tensor:
    """[out, in] -> [ceil(out / 16), in / 2, 16, 2]: one column tile's input
    pairs are one contiguous run, 1 KB per AMX tile load, 64 bytes per
    vdpbf16ps operand; padding columns are 0."""
    out_features, in_features = weight.shape
    tiles = -(-out_features // TILE_COLUMNS)
    padded = weight.new_zeros(tiles * TILE_COLUMNS, in_features)
    padded[:out_features] = weight
    return padded.view(tiles, TILE_COLUMNS, in_features // 2, 2).permute(0, 2, 1, 3).contiguous()


def alternate_halves(tiles: torch.Tensor) -> torch.Tensor:
    """Packed [gate tiles; up tiles] -> gate 0, up 0, gate 1, up 1, ...: the
    kernel's column-tile pairs, each giving 16 columns of silu(gate) * up."""
    half = tiles.shape[0] // 2
    return tiles.view(2, half, *tiles.shape[1:]).transpose(0, 1).reshape(tiles.shape).contiguous()
