"""The counter-based random stream: exact, uniform, independent per choice."""

import torch

from gpuworkers.engine.sampling.rng import MASK32, choice_seed, uniform


def murmur3_reference(words, seed):
    """murmur3_x86_32 over 32-bit words, in plain Python integers."""

    def rotl(x, r):
        return ((x << r) | (x >> (32 - r))) & MASK32

    h = seed
    for k in words:
        k = (k * 0xCC9E2D51) & MASK32
        k = rotl(k, 15)
        k = (k * 0x1B873593) & MASK32
        h = rotl(h ^ k, 13)
        h = (h * 5 + 0xE6546B64) & MASK32
    h ^= 4 * len(words)
    h ^= h >> 16
    h = (h * 0x85EBCA6B) & MASK32
    h ^= h >> 13
    h = (h * 0xC2B2AE35) & MASK32
    return h ^ (h >> 16)


def test_tensor_hash_equals_murmur3_in_plain_integers():
    """No int64 overflow or sign extension anywhere in the tensor version."""
    seeds = [0, 1, 2**31, 2**32 - 1, 2**62 + 12345, 2**63 - 1, choice_seed(99, 3)]
    counters = [0, 1, 7, 2**31 + 5, 2**32 - 1, 1000, 123456]
    got = uniform(torch.tensor(seeds), torch.tensor(counters)).tolist()
    for seed, counter, value in zip(seeds, counters, got, strict=True):
        words = (seed & MASK32, seed >> 32, counter)
        high = murmur3_reference(words, 0x2545F491)
        low = murmur3_reference(words, 0x9E3779B9)
        assert value == (((high << 21) | (low >> 11)) + 0.5) * 2.0**-53


def test_uniforms_are_uniform_over_seeds_and_over_draws():
    """Chi-square over 256 bins and the Kolmogorov-Smirnov distance, for
    many seeds at one draw index and for one seed's consecutive draws."""
    n = 200_000
    across_seeds = uniform(torch.tensor([choice_seed(s, 0) for s in range(n)]), torch.tensor(0))
    along_draws = uniform(torch.tensor(choice_seed(42, 0)), torch.arange(n))
    for u in (across_seeds, along_draws):
        assert float(u.min()) > 0.0 and float(u.max()) < 1.0
        counts = torch.bincount((u * 256).long(), minlength=256).double()
        expected = n / 256
        chi2 = float(((counts - expected) ** 2 / expected).sum())
        assert chi2 < 347.0, chi2  # 255 degrees of freedom, p = 0.0001
        sorted_u = u.sort().values
        grid = torch.arange(1, n + 1, dtype=torch.float64) / n
        ks = float((sorted_u - grid).abs().max())
        assert ks < 1.95 / n**0.5, ks  # p = 0.001


def test_consecutive_draws_are_uncorrelated():
    u = uniform(torch.tensor(choice_seed(7, 0)), torch.arange(100_000))
    x = u - u.mean()
    lag1 = float((x[1:] * x[:-1]).mean() / (x * x).mean())
    assert abs(lag1) < 0.015, lag1  # about 5 standard errors


def test_choice_seeds_are_reproducible_distinct_and_63_bit():
    seeds = [choice_seed(1234, i) for i in range(8)]
    assert seeds == [choice_seed(1234, i) for i in range(8)]
    assert len(set(seeds)) == 8 and all(0 <= s < 2**63 for s in seeds)
    assert choice_seed(1234, 0) != choice_seed(1235, 0)
    assert choice_seed(-1, 0) != choice_seed(None, 0)
    assert 0 <= choice_seed(None, 0) < 2**63
