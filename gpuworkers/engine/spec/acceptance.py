"""Which drafted tokens a verification step keeps.

At each of the 1 + k verified positions the sampler draws a target token
exactly as the non-speculative sampler would at that position (same
processed logits, same uniform ``u = uniform(seed, draw index)``, the
same inverse-CDF draw; greedy rows take the argmax). The drafts are kept
up to the first position whose target differs, and that target is kept
too; after k accepted drafts the last position's target is a bonus token.

For greedy rows this gives exactly the non-speculative tokens. For
sampled rows it is the rejection sampler of speculative decoding with a
point-mass draft distribution q = delta(d), as n-gram drafts are:

- the draft is accepted iff ``u`` falls in d's interval of the CDF, which
  has probability p(d) = min(1, p(d) / q(d));
- otherwise the target is the token whose interval holds ``u``, given
  that ``u`` is outside d's: probability p(x) / (1 - p(d)) for x != d,
  which is normalize(max(0, p - q)), the residual distribution.

So every emitted token is distributed as the target model's, and a
seeded request draws the same tokens with speculation as without (given
the same logits), because each position uses the draw the plain sampler
would use for that output index.
"""

from __future__ import annotations


def num_accepted(drafts: list[int], targets: list[int]) -> int:
    """How many leading drafts equal their targets (``len(targets)`` is
    ``len(drafts) + 1``); the emitted tokens are ``targets[: n + 1]``."""
    if len(targets) != len(drafts) + 1:
        raise ValueError(f"{len(targets)} targets for {len(drafts)} drafts")
    accepted = 0
    for draft, target in zip(drafts, targets, strict=False):
        if draft != target:
            break
        accepted += 1
    return accepted
