"""Linear layers with weights pre-packed for oneDNN, on CPU in bfloat16.

``F.linear`` in bfloat16 already runs on oneDNN (AMX or AVX-512 where the CPU
has them) but reorders the weight into oneDNN's blocked layout on every
call, which dominates small-batch (decode) steps. Packing once at load time
removes that copy; vLLM's CPU build does the same. Results are
bit-identical to ``F.linear`` (tests/gpuworkers/engine/test_cpu_fast_paths.py).
On CPUs with AMX or AVX512_BF16, ``pack_linears`` uses the compiled tile
kernels of tile_linear.py instead wherever they apply. float32 keeps
``F.linear`` (MKL), which is what the parity tests compare against
transformers with.
"""

from __future__ import annotations

import torch
from torch import nn

from gpuworkers.engine.cpu.tile_linear import tile_linear_kind
from gpuworkers.engine.dtypes import cpu_has_fast_bfloat16

# A batch-size hint for oneDNN's choice of blocked layout; one packing
# serves decode (a few rows) and prefill (thousands) alike.
PACKING_ROWS_HINT = 2048


def packing_available(dtype: torch.dtype, device: torch.device | str) -> bool:
    # oneDNN's bfloat16 reorder needs AVX-512 (BW/VL/DQ), AVX-NE-CONVERT or
    # AMX; on an AVX2-only CPU (AMD Zen 3, say) it raises, and bfloat16
    # matmuls there run on a slow generic path anyway (dtype "auto" picks
    # float32 on such CPUs: engine/dtypes.py).
    return (
        torch.device(device).type == "cpu"
        and dtype == torch.bfloat16
        and torch.backends.mkldnn.is_available()
        and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")
        and hasattr(torch.ops.mkldnn, "_linear_pointwise")
        and cpu_has_fast_bfloat16()
    )


class PackedLinear(nn.Module):
    """``y = x @ W.T + b`` with W in oneDNN's blocked layout."""

    def __init__(self, linear: nn.Linear):
        super().__init__()
        self.in_features = linear.in_features
        self.out_features = linear.out_features
        weight = linear.weight.detach()
        self.register_buffer(
            "packed_weight",
            torch.ops.mkldnn._reorder_linear_weight(weight, PACKING_ROWS_HINT),
            persistent=False,
        )
        bias = linear.bias.detach() if linear.bias is not None else None
        self.register_buffer("bias", bias, persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() == 2:  # the engine's flat [tokens, features] batch
            return torch.ops.mkldnn._linear_pointwise(
                x, self.packed_weight, self.bias, "none", [], ""
            )
        rows = x.reshape(-1, self.in_features)
        out = torch.ops.mkldnn._linear_pointwise(
            rows, self.packed_weight, self.bias, "none", [], ""
        )
        return out.view(*x.shape[:-1], self.out_features)


def pack_linears(model: nn.Module, lib=None) -> int:
    """Swap every nn.Linear of ``model`` for this machine's tile linear
    (AmxLinear, Dpbf16Linear) where ``lib`` has one and the shape fits it,
    else a PackedLinear; returns how many.

    A SwiGLU MLP's gate_up (a module with ``gate_up_activated``) becomes a
    tile linear that applies silu(gate) * up itself, where it fits."""
    kind = tile_linear_kind(lib)
    swaps = [
        (parent, name, child)
        for parent in model.modules()
        for name, child in parent.named_children()
        if isinstance(child, nn.Linear)
    ]
    for parent, name, child in swaps:
        if kind is None or not kind.applies(lib, child.in_features):
            setattr(parent, name, PackedLinear(child))
            continue
        swiglu = (
            name == "gate_up"
            and hasattr(parent, "gate_up_activated")
            and kind.applies_swiglu(lib, child)
        )
        setattr(parent, name, kind(lib, child, swiglu=swiglu))
        if swiglu:
            parent.gate_up_activated = True
    return len(swaps)
