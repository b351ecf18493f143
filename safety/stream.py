"""Moderation of a reply while it streams: a sliding window per choice.

``ReplyScreen`` is fed a response's delta events in order and says which
events the client may see now. Each choice keeps the last WINDOW_CHARS of
its text, so a violation split across tokens ("fu" + "ck") is judged on the
joined text. The classifier and the deny list judge *complete* words only:
the word still growing at the end of the window may turn out to be a
longer, innocent one ("ass" -> "assignment"). When that trailing partial
word would already be a violation, the event is held back (not sent) until
the next event shows how the word ends; so a violation is cut before its
last token reaches the client, and a reply pays the extra latency only on
the rare suspicious prefix. A blocking finding cuts the reply: the events
held and everything after are withheld, and the caller ends the response
with ``content_filter``.

Per event the cost is one regex over the window (deny list) and, when a
word completed since the last check, one classifier score of the window's
tail (a sparse dot product: ``safety.checks.classifier``). Deterministic:
the same events and policy always cut at the same event, which is how a
resumed stream (a reader of its own) shows the same ending.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from safety.checks import CLASSIFIER, Finding
from safety.checks.classifier import profanity_model
from safety.checks.denylist import MAX_TERM_CHARS, DenyList
from safety.moderation import OFFENSIVE
from safety.policy import Action, Policy
from wire.events import Delta

# Holds a deny-list phrase of MAX_TERM_CHARS plus the delta that ends it.
WINDOW_CHARS = 2 * MAX_TERM_CHARS
# The classifier judges the last words only: TF-IDF rows are normalised,
# so a long window would dilute one offensive phrase.
CLASSIFIER_CHARS = 120
# A word suspicious for this many events is judged as it stands.
MAX_HELD = 16
_TRAILING_WORD = re.compile(r"\w+$")
_LEADING_WORD = re.compile(r"^\w+")


def _tail(text: str, size: int) -> str:
    """The last ``size`` characters, starting at a word boundary."""
    if len(text) <= size:
        return text
    start = len(text) - size
    tail = text[start:]
    if text[start - 1].isalnum() or text[start - 1] == "_":
        tail = _LEADING_WORD.sub("", tail)
    return tail


@dataclass(slots=True)
class ScreenResult:
    # Events the client may see now, in order.
    release: list[Delta] = field(default_factory=list)
    # A blocking finding: withhold the rest and end with content_filter.
    cut: Finding | None = None
    # Findings of checks whose action is FLAG, each check reported once.
    flags: list[Finding] = field(default_factory=list)
    # The window the finding was made in (kept only if the tenant opted in).
    text: str = ""


@dataclass(slots=True)
class _Judgement:
    hit: Finding | None = None
    suspicious: bool = False
    flags: list[Finding] = field(default_factory=list)


class ReplyScreen:
    """The output stage for one response (all of its choices)."""

    __slots__ = (
        "_policy",
        "_model",
        "_deny",
        "_windows",
        "_unchecked",
        "_scored",
        "_held",
        "_flagged",
    )

    def __init__(self, policy: Policy):
        self._policy = policy
        self._model = profanity_model() if policy.classifier != Action.OFF else None
        self._deny = DenyList(policy.deny_terms) if policy.deny != Action.OFF else None
        self._windows: dict[int, str] = {}
        # Per choice: how many characters at the window's end no deny-list
        # search has seen as complete text (older ones would have cut already).
        self._unchecked: dict[int, int] = {}
        # Per choice: the complete text last given to the classifier, and its verdict.
        self._scored: dict[int, tuple[str, Finding | None]] = {}
        self._held: list[Delta] = []
        self._flagged: set[str] = set()

    def feed(self, event: Delta) -> ScreenResult:
        """Judge one delta event; returns what to send and whether to cut."""
        touched = []
        for choice in event.choices:
            text = choice.text
            if text:
                index = choice.index
                self._windows[index] = _tail(self._windows.get(index, "") + text, WINDOW_CHARS)
                self._unchecked[index] = self._unchecked.get(index, 0) + len(text)
                touched.append(index)
        self._held.append(event)
        result, suspicious = self._judge(touched, final=len(self._held) >= MAX_HELD)
        if result.cut is None and not suspicious:
            result.release, self._held = self._held, []
        return result

    def finish(self) -> ScreenResult:
        """The reply ended: the end of the text is a word boundary; judge what is held."""
        result, _ = self._judge(list(self._windows), final=True)
        if result.cut is None:
            result.release, self._held = self._held, []
        return result

    def _judge(self, indexes: list[int], *, final: bool) -> tuple[ScreenResult, bool]:
        """The verdict on the choices ``indexes``, and whether one is suspicious."""
        result, suspicious = ScreenResult(), False
        for index in indexes:
            window = self._windows[index]
            judgement = self._judge_window(index, window, final)
            for flag in judgement.flags:
                if flag.check not in self._flagged:
                    self._flagged.add(flag.check)
                    result.flags.append(flag)
                    result.text = window
            if judgement.hit is not None:
                result.cut, result.text = judgement.hit, window
                return result, False
            suspicious = suspicious or judgement.suspicious
        return result, suspicious

    def _judge_window(self, index: int, window: str, final: bool) -> _Judgement:
        policy, out = self._policy, _Judgement()
        partial = None if final else _TRAILING_WORD.search(window)
        complete = window[: partial.start()] if partial else window

        def found(finding: Finding, action: Action) -> None:
            if action == Action.BLOCK:
                out.hit = out.hit or finding
            elif action == Action.FLAG:
                out.flags.append(finding)

        if self._deny:
            # A new match overlaps the unchecked end; it starts at most the
            # longest term before it.
            unchecked = self._unchecked.get(index, 0)
            start = max(0, len(window) - unchecked - self._deny.longest)
            finding = self._deny.first(window, start, len(complete))
            if finding is not None:
                found(finding, policy.deny)
            self._unchecked[index] = len(window) - len(complete)
        if self._model is not None:
            last = self._scored.get(index)
            if last is None or last[0] != complete:
                score = self._model.score(_tail(complete, CLASSIFIER_CHARS))
                hit = Finding(CLASSIFIER, OFFENSIVE, score) if score >= policy.threshold else None
                last = self._scored[index] = (complete, hit)
            if last[1] is not None:
                found(last[1], policy.classifier)
        for check, action in policy.extra:
            for finding in check.run([complete])[0][:1]:
                found(finding, action)
        if out.hit is None and partial is not None:
            out.suspicious = self._partial_blocks(window, partial.group())
        return out

    def _partial_blocks(self, window: str, word: str) -> bool:
        """Whether the window, were its last word complete, would be cut."""
        policy = self._policy
        if self._deny and policy.deny == Action.BLOCK:
            start = max(0, len(window) - len(word) - self._deny.longest)
            finding = self._deny.first(window, start)
            while finding is not None and finding.end < len(window):
                finding = self._deny.first(window, finding.end)
            if finding is not None:
                return True
        if (
            self._model is not None
            and policy.classifier == Action.BLOCK
            and self._model.risky(word)
        ):
            return self._model.score(_tail(window, CLASSIFIER_CHARS)) >= policy.threshold
        return False
