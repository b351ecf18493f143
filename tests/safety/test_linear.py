"""User text is screened in linear time, finding what the old patterns found.

The old patterns (Python's backtracking ``re``, with lookarounds) are kept
here as the reference: on short random texts, where backtracking is cheap,
the RE2 patterns find the same spans. On 1 MB adversarial texts the time
grows about linearly: 10 times the text takes far less than 100 times
as long (the e-mail pattern took 90 ms on 8,000 ``%`` and 14 s on 100,000).
"""

from __future__ import annotations

import re
import time

from hypothesis import given, settings
from hypothesis import strategies as st

from safety.checks.classifier import profanity_model
from safety.checks.denylist import DenyList
from safety.checks.linear import LinearPattern
from safety.checks.pii import RECOGNIZERS, pii_find
from safety.moderation import texts_moderate
from safety.policy import Action, Policy

OLD_PII = {
    "EMAIL_ADDRESS": r"(?<![\w.+-])[A-Za-z0-9._%+-]+@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*"
    r"\.[A-Za-z]{2,}\b",
    "CREDIT_CARD": r"(?<![\d-])\d(?:[ -]?\d){12,18}(?![\d-])",
    "IBAN_CODE": r"\b[A-Z]{2}\d{2}(?: ?[A-Z0-9]){11,30}\b",
    "US_SSN": r"(?<![\d-])\d{3}([- ])\d{2}\1\d{4}(?![\d-])",
    "UK_NINO": r"\b(?!BG|GB|KN|NK|NT|TN|ZZ)[A-CEGHJ-PR-TW-Z][A-CEGHJ-NPR-TW-Z]"
    r" ?\d{2} ?\d{2} ?\d{2} ?[A-D]\b",
    "PHONE_NUMBER": r"(?<![\w+])(?:\+\d{1,3}[ .-]?)?(?:\(\d{1,4}\)[ .-]?)?\d{2,4}"
    r"(?:[ .-]?\d{2,4}){1,4}(?!\w)",
}
# Texts made of what the patterns care about, so that they often match.
ALPHABET = "aZx@.%+-_ ()0123456789GBACé٣\n"
PII_TEXT = st.text(alphabet=ALPHABET, max_size=60) | st.sampled_from(
    [
        "mail a@b.com, c@d.com",
        "call +44 20 7946 0958 or (555) 123-4567",
        "4111 1111 1111 1111 and 123-45-6789",
        "AB 12 34 56 C GB123456A",
        "GB82 WEST 1234 5698 7654 32",
    ]
)


def _ratio(run, small: str, large: str) -> float:
    """How many times longer ``large`` takes than ``small`` (best of a few
    runs; the small one repeated, so that a millisecond is not noise)."""

    def best(text: str, repeat: int) -> float:
        times = []
        for _ in range(3):
            started = time.perf_counter()
            for _ in range(repeat):
                run(text)
            times.append((time.perf_counter() - started) / repeat)
        return min(times)

    return best(large, 1) / best(small, 10)


@settings(max_examples=400, deadline=None)
@given(PII_TEXT)
def test_pii_patterns_find_what_the_backtracking_ones_found(text):
    for recognizer in RECOGNIZERS:
        old = [m.span() for m in re.finditer(OLD_PII[recognizer.entity], text)]
        new = list(recognizer.pattern.spans(text))
        if recognizer.entity == "UK_NINO":
            # The not-issued prefixes are a validator now, not a lookahead.
            new = [s for s in new if recognizer.valid(text[s[0] : s[1]])]
        assert new == old, (recognizer.entity, text)


@settings(max_examples=300, deadline=None)
@given(
    st.text(alphabet="ab é_-\t\u00a0", max_size=40),
    st.integers(0, 40),
    st.integers(0, 40),
)
def test_deny_list_matches_as_the_lookaround_pattern_did(text, start, end):
    terms = ("ab", "a b", "é", "b_a")
    deny = DenyList(terms)
    parts = [r"\s+".join(re.escape(w) for w in t.split()) for t in sorted(terms, key=len)[::-1]]
    old = re.compile(r"(?<!\w)(?:" + "|".join(parts) + r")(?!\w)", re.IGNORECASE)
    assert [(f.start, f.end) for f in deny.find(text)] == [m.span() for m in old.finditer(text)]
    start, end = min(start, len(text)), min(max(start, end), len(text))
    found = deny.first(text, start, end)
    m = old.search(text, start, end)
    got = (found.start, found.end) if found else None
    assert got == (m.span() if m else None)


def test_the_classifiers_token_pattern_is_linear():
    """Kept on Python's engine (one C call a text, on the streamed path):
    its pattern, \\b\\w\\w+\\b, cannot backtrack more than a word."""
    model = profanity_model()
    assert model._token_re.pattern == r"(?u)\b\w\w+\b"
    for unit in ("a", "a!", "ab ", "_", "é1", "%", "a_-"):
        small, large = unit * (100_000 // len(unit)), unit * (1_000_000 // len(unit))
        ratio = _ratio(model.score, small, large)
        assert ratio < 30, (unit, ratio)


def test_a_megabyte_of_percent_signs_takes_linear_time():
    # Before: 8,000 took 90 ms and 100,000 about 14 s (quadratic).
    assert _ratio(pii_find, "%" * 100_000, "%" * 1_000_000) < 30


def test_adversarial_megabytes_take_linear_time_in_every_check():
    policy = Policy(
        classifier=Action.FLAG, pii=Action.REDACT, deny=Action.BLOCK, deny_terms=("x y z",)
    )
    for unit in ("%", "a.", "1 ", "a@", "x ", "+1-", "A1", "é"):
        small, large = unit * (100_000 // len(unit)), unit * (1_000_000 // len(unit))
        ratio = _ratio(lambda t: texts_moderate([t], policy), small, large)
        assert ratio < 30, (unit, ratio)


def test_the_search_restarts_where_the_match_ended():
    """The character after one match may be the one before the next."""
    pattern = LinearPattern("ab", before="a-z", after="a-z")
    assert list(pattern.spans("ab ab-ab")) == [(0, 2), (3, 5), (6, 8)]
    assert list(pattern.spans("xab ab", 1)) == [(4, 6)]
    assert list(pattern.spans("ab abx", 0, 5)) == [(0, 2), (3, 5)]
