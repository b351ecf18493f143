"""Speculative decoding without a second model (n-gram prompt lookup).

- ``drafter.py``: ``NgramDrafter``, proposes the tokens that followed the
  sequence's last n-gram where it occurred before (vLLM's ``ngram``).
- ``acceptance.py``: how many drafts a verification step keeps, and why
  that is exact rejection sampling for point-mass drafts.
- ``state.py``: per-sequence counters and back-off (``SpecState``).
- ``speculator.py``: ``Speculator``, the scheduler's policy: who drafts
  this step, how many tokens, and the engine-wide counters.

The scheduler gives a drafting sequence 1 + k query tokens (its last
token and the drafts); the runner computes logits at every one of them;
the sampler draws a target at each position with the inputs the
non-speculative sampler would have used there; the scheduler keeps the
targets up to the first that differs from its draft and rolls the rest
of the KV back.
"""

from gpuworkers.engine.spec.acceptance import num_accepted
from gpuworkers.engine.spec.drafter import NgramDrafter
from gpuworkers.engine.spec.speculator import Speculator
from gpuworkers.engine.spec.state import SpecState

__all__ = ["NgramDrafter", "SpecState", "Speculator", "num_accepted"]
