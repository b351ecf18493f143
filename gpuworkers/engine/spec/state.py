"""Per-sequence speculation counters and back-off."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True)
class SpecState:
    """One choice's drafting record.

    Drafts themselves live only in the step that verifies them (the
    scheduler's ``ScheduledSeq``): a preempted or swapped sequence carries
    no draft, and the next step drafts afresh from its verified tokens.
    """

    # Draft tokens verified so far, and how many of them were accepted.
    drafted: int = 0
    accepted: int = 0
    # Moving average of each verification's accepted fraction; starts
    # optimistic so a sequence gets a few tries before backing off.
    recent_rate: float = 1.0
    # No drafting until the choice has this many output tokens (back-off
    # after a run of poor acceptance; 0: never paused).
    paused_until: int = 0

    def record(self, drafted: int, accepted: int, decay: float) -> None:
        """Count one verification and fold its rate into ``recent_rate``."""
        self.drafted += drafted
        self.accepted += accepted
        rate = accepted / drafted
        self.recent_rate = decay * self.recent_rate + (1.0 - decay) * rate
