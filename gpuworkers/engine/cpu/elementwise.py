"""Fused bfloat16 element-wise ops on CPU (elementwise.cpp), behind torch-like calls.

Each takes and returns torch tensors; callers check ``FusedOps.applies``
first and keep their plain torch code for other dtypes and devices.
"""

from __future__ import annotations

import torch


class FusedOps:
    def __init__(self, lib):
        self.lib = lib

    @staticmethod
    def applies(x: torch.Tensor) -> bool:
        return x.dtype == torch.bfloat16 and x.device.type == "cpu"

    def rms_norm(
        self,
        x: torch.Tensor,
        weight: torch.Tensor,
        eps: float,
        residual: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """``weight * norm(x)``; with ``residual``, first ``residual += x`` in
        place and normalise the sum. ``x`` may have a row stride."""
        hidden = x.shape[-1]
        if x.stride(-1) != 1:
            x = x.contiguous()
        rows = x.reshape(-1, hidden) if x.dim() != 2 else x
        out = torch.empty(rows.shape, dtype=x.dtype)
        if residual is not None and not residual.is_contiguous():
            raise ValueError("the residual must be contiguous")
        self.lib.rms_norm_bf16(
            rows.data_ptr(),
            residual.data_ptr() if residual is not None else None,
            weight.data_ptr(),
            out.data_ptr(),
            rows.shape[0],
            hidden,
            rows.stride(0),
            eps,
        )
        # view() alone costs about as much as a decode batch's kernel.
        return out if rows is x else out.view(x.shape)

    def rotary_(
        self, x: torch.Tensor, positions: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
    ) -> torch.Tensor:
        """Rotate ``x`` [tokens, heads, head_dim] in place (rows may be strided)."""
        tokens, heads, head_dim = x.shape
        if x.stride(2) != 1 or x.stride(1) != head_dim:
            raise ValueError("heads must be contiguous within a token's row")
        positions = positions.contiguous()
        self.lib.rotary_bf16(
            x.data_ptr(),
            tokens,
            x.stride(0),
            heads,
            head_dim,
            positions.data_ptr(),
            cos.data_ptr(),
            sin.data_ptr(),
        )
        return x

    def silu_and_mul(self, gate_up: torch.Tensor) -> torch.Tensor:
        """``silu(gate) * up`` for rows laid out as [gate | up]."""
        gate_up = gate_up.contiguous()
        width = gate_up.shape[-1] // 2
        rows = gate_up.numel() // gate_up.shape[-1]
        out = torch.empty((*gate_up.shape[:-1], width), dtype=gate_up.dtype)
        self.lib.silu_and_mul_bf16(gate_up.data_ptr(), out.data_ptr(), rows, width)
        return out
