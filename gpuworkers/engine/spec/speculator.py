"""The scheduler's speculation policy: who drafts this step, and how much.

Speculation pays where a step's cost hardly grows with its query rows:
small decode batches, whose time goes to reading the weights. With many
sequences decoding, verifying k more tokens each costs real compute for
drafts that are often rejected, so above ``speculative_max_batch``
running decodes a step drafts nothing, and drafts only ever take token
budget that nothing else in the step wanted. A sequence whose recent
acceptance falls under ``speculative_min_acceptance`` stops drafting for
``BACKOFF_TOKENS`` output tokens, then tries again.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gpuworkers.engine.config import EngineConfig
from gpuworkers.engine.spec.drafter import NgramDrafter

if TYPE_CHECKING:
    from gpuworkers.engine.sequence import Sequence

# Output tokens a sequence with poor acceptance waits before drafting again.
BACKOFF_TOKENS = 32
# Weight of the history in each sequence's moving acceptance rate: with
# 0.75, five fully rejected verifications in a row take it from 1.0 to
# under 0.25.
RATE_DECAY = 0.75


class Speculator:
    """Drafts for eligible decodes, and the engine-wide counters."""

    def __init__(self, config: EngineConfig):
        self.config = config
        self.drafter = None
        if config.speculative_method == "ngram":
            self.drafter = NgramDrafter(
                config.prompt_lookup_min, config.prompt_lookup_max, config.num_speculative_tokens
            )
        # Verifications (a sequence's drafts checked in one step), draft
        # tokens verified, and those accepted.
        self.num_verifications = 0
        self.num_draft_tokens = 0
        self.num_accepted_tokens = 0

    def step_allows(self, num_decodes: int) -> bool:
        """Whether a step with ``num_decodes`` decoding sequences drafts at all."""
        return self.drafter is not None and num_decodes <= self.config.speculative_max_batch

    def propose(self, seq: Sequence, budget: int, max_model_len: int) -> list[int]:
        """Drafts for ``seq``, which decodes one token this step (none if it
        may not speculate now).

        At most: ``budget`` tokens; as many as leave room for the target
        after them within max_tokens and the model's context (so a length
        limit can only end the last emitted token, and drafts never need
        blocks beyond the request's reservation).
        """
        request = seq.request
        params = request.params
        if (
            seq.num_output_tokens < 1
            or seq.num_uncomputed_tokens != 1
            or (params.n > 1 and not request.forked)
            # Grammar-constrained requests (another branch's field): their
            # token masks depend on the drafts' states; not verified here.
            or getattr(params, "structured_output", None) is not None
            or seq.num_output_tokens < seq.spec.paused_until
        ):
            return []
        room = min(
            budget,
            params.max_tokens - seq.num_output_tokens - 1,
            max_model_len - seq.num_tokens - 1,
        )
        if room < 1:
            return []
        return self.drafter.propose(seq.token_ids, room)

    def record(self, seq: Sequence, drafted: int, accepted: int) -> None:
        """One verification of ``seq``: counters, and back-off if acceptance stays low."""
        self.num_verifications += 1
        self.num_draft_tokens += drafted
        self.num_accepted_tokens += accepted
        state = seq.spec
        state.record(drafted, accepted, RATE_DECAY)
        if state.recent_rate < self.config.speculative_min_acceptance:
            state.paused_until = seq.num_output_tokens + BACKOFF_TOKENS
            state.recent_rate = 1.0

    def stats(self) -> dict:
        return {
            "spec_verifications": self.num_verifications,
            "spec_draft_tokens": self.num_draft_tokens,
            "spec_accepted_tokens": self.num_accepted_tokens,
        }
