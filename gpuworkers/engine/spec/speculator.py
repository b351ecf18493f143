"""The scheduler's speculation policy: who drafts this step, and how much.

A step's time is modelled as ``fixed + rows`` row-costs: ``fixed``
(``speculative_fixed_cost_rows``) is what does not grow with the step's
query rows (reading the weights, per-step work), each row adds one. A
draft token is one more row that yields a token with the chance that it
and the drafts before it are accepted (the sequence's recent acceptance
rate to the power of its depth). It is verified only while that chance
beats the step's current outputs per row-cost, so the step's tokens per
second can only rise: small batches verify most drafts, large ones only
those of sequences that keep being right (a reply that quotes its
prompt, or one that has fallen into a loop). Drafts only ever take token
budget that nothing else in the step wanted, and no step with more than
``speculative_max_batch`` decodes drafts at all. A sequence whose recent
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
        # Verifications whose draft at each position (0: the first) was accepted.
        self.accepted_per_pos = [0] * config.num_speculative_tokens

    def step_allows(self, num_decodes: int) -> bool:
        """Whether a step with ``num_decodes`` decoding sequences drafts at all."""
        return self.drafter is not None and num_decodes <= self.config.speculative_max_batch

    def plan(
        self, decodes: list[Sequence], step_rows: int, budget: int, max_model_len: int
    ) -> list[list[int]]:
        """The drafts worth verifying for each of ``decodes`` (one list each,
        maybe empty) in a step that already has ``step_rows`` query rows.

        Every candidate draft token is worth ``rate ** depth`` expected
        tokens for one row; they are taken best first while that beats the
        step's expected outputs per row-cost, and within ``budget``.
        """
        fixed = self.config.speculative_fixed_cost_rows
        outputs, rows = float(len(decodes)), float(step_rows)
        proposed: list[list[int]] = []
        candidates = []
        for index, seq in enumerate(decodes):
            rate = seq.spec.recent_rate
            # Skip the lookup where not even a first draft could pay.
            drafts = (
                [] if rate * (fixed + rows) <= outputs else self.propose(seq, budget, max_model_len)
            )
            proposed.append(drafts)
            worth = 1.0
            for depth in range(len(drafts)):
                worth *= rate
                candidates.append((-worth, depth, index))
        candidates.sort()
        taken = [0] * len(decodes)
        for negative_worth, depth, index in candidates:
            worth = -negative_worth
            if budget < 1 or worth * (fixed + rows) <= outputs:
                break
            # Best first, and worth never grows with depth: a sequence's
            # depths are taken in order, so its drafts stay a prefix.
            taken[index] = depth + 1
            outputs += worth
            rows += 1
            budget -= 1
        return [drafts[:count] for drafts, count in zip(proposed, taken, strict=True)]

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
        for position in range(accepted):
            self.accepted_per_pos[position] += 1
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
            "spec_accepted_per_pos": list(self.accepted_per_pos),
        }
