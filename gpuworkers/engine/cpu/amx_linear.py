"""Linear layers on AMX (amx_linear.cpp), bfloat16, any number of rows.

On CPUs with AMX they replace oneDNN's packed linears (packing.py): a
decode step's few rows read the weights at 20-25 GB/s where oneDNN read
15-18 (``python -m bench.decode_linear``), and a row's bits do not depend
on how many rows share the call, so a prompt computed whole and its tail
recomputed after a prefix-cache hit give the same logits.

A SwiGLU MLP's gate_up linear can also apply ``silu(gate) * up`` as it
writes its rows (``swiglu=True``): the same bits as gate_up followed by the
element-wise silu_and_mul, without the [rows, 2 * width] intermediate.
"""

from __future__ import annotations

import torch
from torch import nn

# AMX B tiles: 16 output columns by 16 input pairs.
TILE_COLUMNS = 16


def amx_linear_available(lib) -> bool:
    return lib is not None and bool(lib.amx_linear_supported())


class AmxLinear(nn.Module):
    """``y = x @ W.T + b`` for bfloat16 rows, W in AMX tile order; with
    ``swiglu``, W is [gate; up] (no bias) and ``y = silu(x @ gate.T) * (x @ up.T)``."""

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

    @staticmethod
    def applies(lib, in_features: int) -> bool:
        return amx_linear_available(lib) and in_features % lib.amx_linear_k_multiple() == 0

    @classmethod
    def applies_swiglu(cls, lib, linear: nn.Linear) -> bool:
        """Whether ``linear`` (rows [gate; up]) can run with ``swiglu``."""
        return (
            cls.applies(lib, linear.in_features)
            and linear.bias is None
            and linear.out_features % (2 * TILE_COLUMNS) == 0
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x if x.dim() == 2 else x.reshape(-1, self.in_features)
        if rows.stride(-1) != 1:
            rows = rows.contiguous()
        out = torch.empty((rows.shape[0], self.out_features), dtype=torch.bfloat16)
        if rows.shape[0] and self.swiglu:
            self.lib.amx_swiglu_bf16(
                rows.data_ptr(),
                rows.shape[0],
                rows.stride(0),
                self.in_features,
                self.packed_weight.data_ptr(),
                out.data_ptr(),
                self.out_features,
            )
        elif rows.shape[0]:
            self.lib.amx_linear_bf16(
                rows.data_ptr(),
                rows.shape[0],
                rows.stride(0),
                self.in_features,
                self.packed_weight.data_ptr(),
                self.bias.data_ptr() if self.bias is not None else None,
                out.data_ptr(),
                self.out_features,
            )
        return out if x.dim() == 2 else out.view(*x.shape[:-1], self.out_features)


def pack_tiles(weight: torch.Tensor) -> torch.Tensor:
    """[out, in] -> [ceil(out / 16), in / 2, 16, 2]: one column tile's input
    pairs are one contiguous run, 1 KB per AMX tile load; padding columns are 0."""
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
