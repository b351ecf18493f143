"""Weight-only int8 linear layers (``EngineConfig.quantization = "int8"``).

Every linear of the model, the LM head included, keeps its weight as int8
with one float32 scale per output channel (symmetric: ``W ~= q * scale``,
``q`` in [-127, 127], ``scale = max |W[row]| / 127``), quantized once at
load from the checkpoint's weights. Activations stay in the model's dtype;
only the weights shrink, so a decode step, which streams every weight once
for a few rows, reads about half the bytes of bfloat16. A tied LM head is
quantized as a linear of its own: the embedding table it shares its
weight with stays in full precision for the token lookup.

Kernels, the fastest this machine has: in bfloat16 with the CPU fast
paths, the compiled tile kernels (engine/cpu/int8_linear.py: AMX, else
AVX512_BF16's vdpbf16ps), which widen the int8 weights to bfloat16
exactly and scale each column in their epilogue; elsewhere torch's own
weight-only int8 matmul (``aten._weight_int8pack_mm``), so the switch
works on every CPU.
"""

from __future__ import annotations

import torch
from torch import nn

QUANTIZATIONS = ("int8",)
INT8_MAX = 127


def check_quantization(value: str | None) -> str | None:
    """``value`` if it names a supported quantization (or is None/empty: off)."""
    if value in (None, ""):
        return None
    if value not in QUANTIZATIONS:
        raise ValueError(
            f"unknown quantization {value!r}: expected one of {', '.join(QUANTIZATIONS)}"
            " (or none for full-precision weights)"
        )
    return value


def quantize_int8(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``weight`` [out, in] -> (int8 [out, in], float32 scales [out]) with
    ``weight ~= q * scales[:, None]``: each element off by at most half its
    row's scale. An all-zero row gets scale 1 (and zeros)."""
    weight = weight.detach().float()
    peak = weight.abs().amax(dim=1)
    scales = torch.where(peak > 0, peak / INT8_MAX, torch.ones_like(peak))
    quantized = torch.round(weight / scales[:, None]).clamp_(-INT8_MAX, INT8_MAX)
    return quantized.to(torch.int8), scales


def dequantize_int8(quantized: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """The float32 weight an int8 linear computes with."""
    return quantized.float() * scales[:, None]


class Int8Linear(nn.Module):
    """``y = x @ (q * scales).T + b`` on torch's weight-only int8 matmul.

    In float32: the op's bfloat16 path rounds the scales to bfloat16 and
    crashed on some shapes (odd inputs) on torch 2.13; bfloat16 models on
    CPUs with the kernels use engine/cpu/int8_linear.py instead."""

    name = "torch"
    # The op's blocking may depend on the row count: deterministic steps
    # run it in fixed row tiles (models/batch_invariant.py).
    rows_are_independent = False

    def __init__(self, linear: nn.Linear):
        super().__init__()
        self.in_features = linear.in_features
        self.out_features = linear.out_features
        quantized, scales = quantize_int8(linear.weight)
        self.register_buffer("quantized", quantized, persistent=False)
        self.register_buffer("scales", scales, persistent=False)
        bias = linear.bias.detach().float() if linear.bias is not None else None
        self.register_buffer("bias", bias, persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, self.in_features).float().contiguous()
        out = torch.ops.aten._weight_int8pack_mm(rows, self.quantized, self.scales)
        if self.bias is not None:
            out += self.bias
        return out.to(x.dtype).view(*x.shape[:-1], self.out_features)


def quantize_linears(model: nn.Module, lib=None) -> str:
    """Swap every nn.Linear of ``model`` for an int8 one; returns the kernel's
    name ("amx", "dpbf16" or "torch"; the first where several ran).

    With ``lib`` (the compiled CPU kernels) and a bfloat16 model, this
    machine's int8 tile linear wherever the shape fits it (a SwiGLU MLP's
    gate_up also applying silu(gate) * up, as with bfloat16 weights), else
    Int8Linear."""
    from gpuworkers.engine.cpu.int8_linear import int8_tile_linear_kind

    swaps = [
        (parent, name, child)
        for parent in model.modules()
        for name, child in parent.named_children()
        if isinstance(child, nn.Linear)
    ]
    kind = int8_tile_linear_kind(lib)
    used = []
    for parent, name, child in swaps:
        bf16_kernel = kind is not None and child.weight.dtype == torch.bfloat16
        if not bf16_kernel or not kind.applies(lib, child.in_features):
            module = Int8Linear(child)
        else:
            swiglu = (
                name == "gate_up"
                and hasattr(parent, "gate_up_activated")
                and kind.applies_swiglu(lib, child)
            )
            module = kind(lib, child, swiglu=swiglu)
            if swiglu:
                parent.gate_up_activated = True
        setattr(parent, name, module)
        used.append(module.name)
    # The kernel of most linears (ties: the compiled one).
    return max(dict.fromkeys(used), key=lambda n: (used.count(n), n != "torch"), default="torch")
