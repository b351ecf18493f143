"""A seeded nn.Linear for the tests of the compiled linears (tile and int8)."""

from __future__ import annotations

import torch


def random_linear(
    out_features: int, in_features: int, bias: bool, seed: int, dtype=torch.float32
) -> torch.nn.Linear:
    """Weights (and bias) drawn from N(0, 1) with ``seed``, then cast to ``dtype``."""
    gen = torch.Generator().manual_seed(seed)
    linear = torch.nn.Linear(in_features, out_features, bias=bias)
    with torch.no_grad():
        linear.weight.copy_(torch.randn(out_features, in_features, generator=gen))
        if bias:
            linear.bias.copy_(torch.randn(out_features, generator=gen))
    return linear.to(dtype)
