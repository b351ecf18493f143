"""Moderation of whole texts: the prompt stage and the moderations endpoint.

The classifier looks at windows of words rather than the whole text: its
TF-IDF features are L2-normalised, so one offensive sentence in a long
prompt would otherwise be diluted below any threshold. A text scores the
highest of its overlapping windows, the same window size the streamed
reply is judged on (``safety.stream``).
"""

from __future__ import annotations

import re
from collections.abc import Collection
from dataclasses import dataclass, field

from safety.checks import CLASSIFIER, DENY_LIST, PII, Finding
from safety.checks.classifier import profanity_model
from safety.checks.denylist import DenyList
from safety.checks.pii import pii_find, pii_redact
from safety.policy import Action, Policy

WINDOW_WORDS = 24
STRIDE_WORDS = 12
OFFENSIVE = "offensive"
_WORD = re.compile(r"\S+")


def classifier_score(text: str) -> float:
    """The highest P(offensive) over the text's windows of WINDOW_WORDS words."""
    model = profanity_model()
    spans = [m.span() for m in _WORD.finditer(text)]
    if len(spans) <= WINDOW_WORDS:
        return model.score(text)
    best = 0.0
    for first in range(0, len(spans) - STRIDE_WORDS, STRIDE_WORDS):
        last = min(first + WINDOW_WORDS, len(spans)) - 1
        best = max(best, model.score(text[spans[first][0] : spans[last][1]]))
    return best


@dataclass(slots=True)
class TextVerdict:
    """What the checks found in a set of texts and what the policy makes of it."""

    # The texts as the model may see them (PII redacted when the policy says so).
    texts: list[str]
    findings: list[Finding] = field(default_factory=list)
    # The findings whose check's action is BLOCK.
    blocking: list[Finding] = field(default_factory=list)
    redacted: bool = False
    # Classifier score of the text (the highest over the texts); None when off.
    score: float | None = None

    @property
    def blocked(self) -> bool:
        return bool(self.blocking)

    @property
    def action(self) -> str:
        """The strongest thing that happened: blocked, redacted, flagged or ''."""
        if self.blocking:
            return "blocked"
        if self.redacted:
            return "redacted"
        return "flagged" if self.findings else ""

    def categories(self) -> list[str]:
        return sorted({f"{f.check}:{f.category}" for f in self.findings})


def texts_moderate(
    texts: list[str], policy: Policy, *, verbatim: Collection[int] = ()
) -> TextVerdict:
    """Run the policy's checks on ``texts`` (the texts of one prompt).

    ``verbatim``: indexes of texts the model must see as sent (a tool's
    name, a schema's enum values): PII found there under a ``redact``
    policy blocks instead, as it cannot be redacted consistently.
    """
    verdict = TextVerdict(texts=list(texts))

    def found(findings: list[Finding], action: Action) -> None:
        verdict.findings.extend(findings)
        if action == Action.BLOCK:
            verdict.blocking.extend(findings)

    if policy.pii != Action.OFF:
        for i, text in enumerate(texts):
            pii = pii_find(text)
            if pii and policy.pii == Action.REDACT and i in verbatim:
                found(pii, Action.BLOCK)
                continue
            found(pii, policy.pii)
            if pii and policy.pii == Action.REDACT:
                verdict.texts[i] = pii_redact(text, pii)
                verdict.redacted = True
    if policy.classifier != Action.OFF:
        verdict.score = max((classifier_score(t) for t in texts), default=0.0)
        if verdict.score >= policy.threshold:
            found([Finding(CLASSIFIER, OFFENSIVE, verdict.score)], policy.classifier)
    if policy.deny != Action.OFF and policy.deny_terms:
        deny = DenyList(policy.deny_terms)
        found([f for t in texts for f in deny.find(t)], policy.deny)
    for check, action in policy.extra:
        found([f for fs in check.run(list(texts)) for f in fs], action)
    return verdict


def finding_summary(findings: list[Finding]) -> list[dict]:
    """Findings as stored on a SafetyEvent: no spans of text, only what and how sure."""
    return [
        {"check": f.check, "category": f.category, "score": round(f.score, 4)} for f in findings
    ]


__all__ = ["CLASSIFIER", "DENY_LIST", "PII", "TextVerdict", "classifier_score", "texts_moderate"]
