"""The engine's CPU fast paths: compiled kernels (paged decode attention,
prefill attention, fused element-wise ops, tile linears on AMX or
AVX512_BF16) loaded with ctypes, and oneDNN-packed linears where neither
is there; a decode step's whole layer stack in one compiled call
(decode_layers.py) where all of those apply.

``enable_cpu_fast_paths(model)`` switches a loaded bfloat16 CPU model onto
them; the attention backend picks the attention kernels itself.
"""

from __future__ import annotations

import torch

from gpuworkers.engine.cpu.build import cpu_library
from gpuworkers.engine.cpu.decode_layers import DecodeLayers
from gpuworkers.engine.cpu.elementwise import FusedOps
from gpuworkers.engine.cpu.packing import PackedLinear, pack_linears, packing_available
from gpuworkers.engine.cpu.tile_linear import AmxLinear, Dpbf16Linear


def enable_cpu_fast_paths(model: torch.nn.Module, dtype: torch.dtype, device: str) -> list[str]:
    """Pack the linears and attach the fused ops where they apply; returns what was enabled."""
    enabled = []
    if torch.device(device).type != "cpu" or dtype != torch.bfloat16:
        return enabled
    lib = cpu_library()
    if packing_available(dtype, device):
        pack_linears(model, lib)
        kinds = {type(m) for m in model.modules()}
        swiglu = any(getattr(m, "gate_up_activated", False) for m in model.modules())
        tile = next((kind.name for kind in (AmxLinear, Dpbf16Linear) if kind in kinds), None)
        enabled += (
            [f"{tile}-linears"] * bool(tile)
            + [f"{tile}-swiglu"] * (bool(tile) and swiglu)
            + ["packed-linears"] * (PackedLinear in kinds)
        )
    if lib is not None:
        fused = FusedOps(lib)
        for module in model.modules():
            if hasattr(module, "fused"):
                module.fused = fused
        enabled.append("fused-elementwise")
        # Last: it binds the packed weights and fused ops set up above.
        model.decode_layers = DecodeLayers.build(lib, model)
        if model.decode_layers is not None:
            enabled.append("decode-layers")
    return enabled


__all__ = ["cpu_library", "enable_cpu_fast_paths"]
