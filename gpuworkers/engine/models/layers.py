"""Building blocks of a Llama-family decoder, numerically matching transformers."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from gpuworkers.engine.models.batch_invariant import linear


class RMSNorm(nn.Module):
    # engine.cpu.FusedOps when enabled (bfloat16 on CPU): one pass instead of six.
    fused = None

    def __init__(self, size: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.fused is not None and self.fused.applies(x):
            return self.fused.rms_norm(x, self.weight, self.eps)
        # Same order of operations as transformers' LlamaRMSNorm: normalise in
        # float32, cast back, then scale.
        dtype = x.dtype
        h = x.to(torch.float32)
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(dtype)

    def add_and_norm(self, residual: torch.Tensor, x: torch.Tensor):
        """``residual + x`` and its norm: (new residual, normalised)."""
        if self.fused is not None and self.fused.applies(x) and residual.is_contiguous():
            # In place: the residual stream is this layer's own tensor.
            return residual, self.fused.rms_norm(x, self.weight, self.eps, residual=residual)
        residual = residual + x
        return residual, self.forward(residual)


def rope_inv_freq(head_dim: int, theta: float, scaling: dict) -> torch.Tensor:
    """Inverse frequencies, including Llama 3 and linear scaling."""
    inv_freq = 1.0 / (
        theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).to(torch.float) / head_dim)
    )
    kind = scaling.get("rope_type") or scaling.get("type") or "default"
    if kind == "linear":
        inv_freq = inv_freq / scaling["factor"]
    elif kind == "llama3":
        factor = scaling["factor"]
        low, high = scaling["low_freq_factor"], scaling["high_freq_factor"]
        old_len = scaling["original_max_position_embeddings"]
        low_wavelen, high_wavelen = old_len / low, old_len / high
        wavelen = 2 * math.pi / inv_freq
        scaled = torch.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
        smooth = (old_len / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
        inv_freq = torch.where(medium, smoothed, scaled)
    elif kind != "default":
        raise ValueError(f"unsupported rope scaling {kind!r}")
    return inv_freq


class RotaryEmbedding(nn.Module):
    """cos/sin tables for every position, computed once in float32."""

    fused = None  # engine.cpu.FusedOps when enabled: rotates q and k in place

    def __init__(self, head_dim: int, max_positions: int, theta: float, scaling: dict, dtype):
        super().__init__()
        inv_freq = rope_inv_freq(head_dim, theta, scaling)
        positions = torch.arange(max_positions, dtype=torch.float32)
        freqs = positions[:, None] * inv_freq[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        self.register_buffer("cos", emb.cos().to(dtype), persistent=False)
        self.register_buffer("sin", emb.sin().to(dtype), persistent=False)

    def forward(self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor):
        if self.fused is not None and self.fused.applies(q) and self.cos.dtype == q.dtype:
            tokens, heads, dim = q.shape
            q_row = heads * dim * q.element_size()
            if k.stride(0) == q.stride(0) and k.data_ptr() == q.data_ptr() + q_row:
                # k's heads follow q's in each row (views of the fused qkv
                # output): rotate both in one call.
                both = q.as_strided((tokens, heads + k.shape[1], dim), (q.stride(0), dim, 1))
                self.fused.rotary_(both, positions, self.cos, self.sin)
            else:
                self.fused.rotary_(q, positions, self.cos, self.sin)
                self.fused.rotary_(k, positions, self.cos, self.sin)
            return q, k
        cos = self.cos[positions].unsqueeze(1)  # [tokens, 1, dim]
        sin = self.sin[positions].unsqueeze(1)
        return q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class MLP(nn.Module):
    """SwiGLU with gate and up fused into one matmul."""

    fused = None  # engine.cpu.FusedOps when enabled: silu(gate) * up in one pass
    # True where the CPU fast paths made gate_up return silu(gate) * up
    # itself (engine/cpu/packing.py): no [rows, 2 * intermediate] round trip.
    gate_up_activated = False

    def __init__(self, hidden: int, intermediate: int):
        super().__init__()
        self.gate_up = nn.Linear(hidden, 2 * intermediate, bias=False)
        self.down = nn.Linear(intermediate, hidden, bias=False)
        self.intermediate = intermediate

    def forward(self, x: torch.Tensor, invariant: bool = False) -> torch.Tensor:
        """``invariant``: batch-invariant linears (models/batch_invariant.py)."""
        if self.gate_up_activated:
            return linear(self.down, linear(self.gate_up, x, invariant), invariant)
        gate_up = linear(self.gate_up, x, invariant)
        if self.fused is not None and self.fused.applies(gate_up):
            return linear(self.down, self.fused.silu_and_mul(gate_up), invariant)
        gate, up = gate_up.split(self.intermediate, dim=-1)
        return linear(self.down, F.silu(gate) * up, invariant)
