"""Batch-invariant linear layers for deterministic steps.

A library matmul may give a row different bits depending on how many rows
share the call: MKL (float32) and oneDNN (bfloat16, with or without AMX)
pick their kernel and blocking by the number of rows M, and so do cuBLAS's
heuristics. On this project's AVX-512 CPU without AMX, float32 rows
differed between M < 16 and larger M while bfloat16 rows happened not to;
nothing promises that on other CPUs. So a deterministic step never lets M
vary: it pads the rows to a multiple of ``INVARIANT_ROWS`` and runs the
layer on tiles of exactly that many rows. Every tile is the same problem
shape, so every row takes the same kernel and reduction order whatever its
neighbours, and its bits depend on its own input only
(tests/gpuworkers/engine/test_deterministic.py checks this from one row to
over two tiles, with the row at the start, middle and end).

The tile linears (gpuworkers/engine/cpu/tile_linear.py, AMX or
vdpbf16ps) need no tiles: each output is its own dot product in a fixed
order, so they say ``rows_are_independent`` and run as they are.

The element-wise work between the linears (RMSNorm, rotary, SiLU, the
fused CPU kernels) is row-wise already: measured invariant, not tiled.
"""

from __future__ import annotations

import torch

# Rows per tile. Larger tiles waste more on padding in small decode steps;
# smaller ones mean more, less efficient calls in long prefills. Measured
# (bench/deterministic.py, 2 threads, a shared machine): 8, 16 and 32 rows
# gave 0.70x, 0.65-0.70x and 0.64x the throughput of the mode off, and
# 1.5x, 1.9-2.0x and 2.8x the time of a one-sequence decode step, but 8
# rows took twice as long as 16 on a lone 1024-token prefill.
INVARIANT_ROWS = 16


def linear(layer: torch.nn.Module, x: torch.Tensor, invariant: bool) -> torch.Tensor:
    """``layer(x)`` for a 2-D ``x``; with ``invariant``, in fixed row tiles."""
    rows = x.shape[0]
    if not invariant or rows == 0 or getattr(layer, "rows_are_independent", False):
        return layer(x)
    padded = -(-rows // INVARIANT_ROWS) * INVARIANT_ROWS
    if padded != rows:
        x = torch.cat([x, x.new_zeros(padded - rows, x.shape[1])])
    elif not x.is_contiguous():
        x = x.contiguous()
    tiles = [layer(x[start : start + INVARIANT_ROWS]) for start in range(0, padded, INVARIANT_ROWS)]
    out = tiles[0] if len(tiles) == 1 else torch.cat(tiles)
    return out[:rows]
