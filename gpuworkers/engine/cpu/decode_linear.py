"""Linear layers for decode-sized batches on AMX (decode_linear.cpp).

A decode step's linears stream every weight once for a few rows; oneDNN
read them at 15-18 GB/s on 2 cores where the compiled kernel reads 20-25
(``python -m bench.decode_linear``). The weights are held a second time,
in AMX tile order, next to oneDNN's packed copy, which keeps serving rows
past ``max_rows`` (prefill chunks).
"""

from __future__ import annotations

import torch

# AMX B tiles: 16 output columns by 16 input pairs.
TILE_COLUMNS = 16


def decode_linear_available(lib) -> bool:
    return lib is not None and bool(lib.decode_linear_supported())


class DecodeLinear:
    """``y = x @ W.T + b`` for at most ``max_rows`` bfloat16 rows."""

    __slots__ = ("lib", "in_features", "out_features", "max_rows", "weight", "bias")

    def __init__(self, lib, weight: torch.Tensor, bias: torch.Tensor | None):
        self.lib = lib
        self.out_features, self.in_features = weight.shape
        self.max_rows = int(lib.decode_linear_max_rows())
        self.weight = pack_tiles(weight.detach().to(torch.bfloat16))
        self.bias = bias.detach().float().contiguous() if bias is not None else None

    @staticmethod
    def applies(lib, in_features: int) -> bool:
        return decode_linear_available(lib) and in_features % lib.decode_linear_k_multiple() == 0

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if x.stride(-1) != 1:
            x = x.contiguous()
        rows = x.shape[0]
        out = torch.empty((rows, self.out_features), dtype=torch.bfloat16)
        self.lib.decode_linear_bf16(
            x.data_ptr(),
            rows,
            x.stride(0),
            self.in_features,
            self.weight.data_ptr(),
            self.bias.data_ptr() if self.bias is not None else None,
            out.data_ptr(),
            self.out_features,
        )
        return out


def pack_tiles(weight: torch.Tensor) -> torch.Tensor:
    """[out, in] -> [ceil(out / 16), in / 2, 16, 2]: one column tile's input
    pairs are one contiguous run, 1 KB per AMX tile load; padding columns are 0."""
    out_features, in_features = weight.shape
    tiles = -(-out_features // TILE_COLUMNS)
    padded = weight.new_zeros(tiles * TILE_COLUMNS, in_features)
    padded[:out_features] = weight
    return padded.view(tiles, TILE_COLUMNS, in_features // 2, 2).permute(0, 2, 1, 3).contiguous()
