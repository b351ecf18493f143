"""Counter-based random numbers: a uniform per (seed, counter), as tensor ops.

Each choice has a 63-bit seed; its k-th draw uses the uniform
``uniform(seed, k)``, a pure function of the two integers (murmur3's
32-bit mix, applied to the seed's two halves and the counter). There is
no generator state to carry, copy or keep on a device: a batch of any
composition computes every row's uniform in one elementwise pass, and the
same (seed, counter) gives the same bits on every device and torch build.

The arithmetic is 32-bit lanes held in int64 tensors. Products are split
into 16-bit halves so that no intermediate leaves the int64 range: signed
overflow is undefined in the C++ kernels, and this way none happens.
"""

from __future__ import annotations

import random

import torch

MASK32 = 0xFFFFFFFF
MASK64 = (1 << 64) - 1
# murmur3 seeds of the hashes giving a uniform's high and low bits.
LANE_SEEDS = (0x2545F491, 0x9E3779B9)


def choice_seed(seed: int | None, choice_index: int) -> int:
    """The 63-bit stream of one choice: random without a request seed; with
    one, distinct and reproducible for each of the n choices."""
    if seed is None:
        return random.getrandbits(63)
    return _splitmix64(_splitmix64(seed & MASK64) ^ choice_index) >> 1


def uniform(seeds: torch.Tensor, counters: torch.Tensor) -> torch.Tensor:
    """float64 uniforms in (0, 1) with 53 random bits, one per element.

    Args:
        seeds: int64, each in [0, 2**63).
        counters: int64 >= 0 (the low 32 bits are used), broadcastable
            against ``seeds``.
    """
    seeds, counters = torch.broadcast_tensors(seeds, counters)
    words = (seeds & MASK32, (seeds >> 32) & MASK32, counters & MASK32)
    # Two murmur3 hashes of the same words with different seeds give the
    # high and low bits. Their key schedules are equal, so it is computed
    # once, and the two hash states advance together, stacked.
    lanes = torch.tensor(LANE_SEEDS, dtype=torch.long, device=seeds.device)
    h = lanes.view(2, *([1] * seeds.dim()))
    for word in words:
        k = _mul32(_rotl(_mul32(word, 0xCC9E2D51), 15), 0x1B873593)
        h = _rotl(h ^ k, 13)
        h = (_mul32(h, 5) + 0xE6546B64) & MASK32
    high, low = _fmix32(h ^ (4 * len(words)))
    bits = (high << 21) | (low >> 11)  # 53 bits: exact in float64
    return (bits.to(torch.float64) + 0.5) * 2.0**-53


def _fmix32(h: torch.Tensor) -> torch.Tensor:
    h = h ^ (h >> 16)
    h = _mul32(h, 0x85EBCA6B)
    h = h ^ (h >> 13)
    h = _mul32(h, 0xC2B2AE35)
    return h ^ (h >> 16)


def _mul32(x: torch.Tensor, c: int) -> torch.Tensor:
    # (x * c) mod 2**32 for x < 2**32 without exceeding 2**49.
    return (x * (c & 0xFFFF) + (((x * (c >> 16)) & 0xFFFF) << 16)) & MASK32


def _rotl(x: torch.Tensor, r: int) -> torch.Tensor:
    return ((x << r) & MASK32) | (x >> (32 - r))


def _splitmix64(x: int) -> int:
    x = (x + 0x9E3779B97F4A7C15) & MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & MASK64
    return x ^ (x >> 31)
