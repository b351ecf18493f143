"""The checks moderation runs, behind one small interface.

A check looks at texts and reports findings; what a finding leads to
(nothing, a flag, a redaction, a refusal, a cut stream) is the policy's
business (``safety.policy``), not the check's. Checks are plain Python with
no Django, so they run in a worker thread and in tests without a database.

The interface is batched on purpose: a guard model served by our own engine
(a ``Check`` whose ``run`` sends the texts as one GenerationRequest batch and
parses the verdicts) fits it without changing the callers.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

CLASSIFIER = "classifier"
PII = "pii"
DENY_LIST = "deny_list"


@dataclass(slots=True, frozen=True)
class Finding:
    """One thing a check found in a text."""

    check: str  # CLASSIFIER, PII, DENY_LIST, or a later check's name
    # What was found: "offensive", a PII entity ("EMAIL_ADDRESS"), a deny-list term.
    category: str
    score: float = 1.0
    # The span in the text checked, when the check knows it (-1: the whole text).
    start: int = -1
    end: int = -1


class Check(Protocol):
    name: str

    def run(self, texts: list[str]) -> list[list[Finding]]:
        """The findings of each text, in order."""
        ...
