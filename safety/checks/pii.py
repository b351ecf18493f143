"""PII recognizers: emails, phone numbers, card numbers, national ids, IBANs.

Our own, not presidio's: presidio-analyzer's pattern recognizers are
reachable without a language model, but the package pulls in spaCy (and its
AnalyzerEngine wants a spaCy model download), which is far more than a few
regular expressions need. Entity names follow presidio's, so a later switch
keeps the same labels. Each recognizer is a pattern plus a validator that
throws out what the pattern over-matches (Luhn for cards, mod 97 for IBANs,
the ranges never issued for US SSNs).

The patterns run in linear time (RE2, ``safety.checks.linear``): prompts
are user text, and Python's backtracking engine took 14 s on 100,000 ``%``
against the e-mail pattern. "Not right after a word character" and the like
are the patterns' ``before`` / ``after`` classes.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from dataclasses import dataclass

from safety.checks import PII, Finding
from safety.checks.linear import DIGIT, WORD, LinearPattern


def luhn_valid(digits: str) -> bool:
    total = 0
    for i, ch in enumerate(reversed(digits)):
        d = int(ch)
        if i % 2 == 1:
            d = d * 2 - 9 if d > 4 else d * 2
        total += d
    return total % 10 == 0


def _digits(text: str) -> str:
    return "".join(ch for ch in text if ch.isdigit())


def _card(match: str) -> bool:
    digits = _digits(match)
    # One repeated digit passes Luhn (0000 0000 0000 0000) but is no card.
    return 13 <= len(digits) <= 19 and len(set(digits)) > 1 and luhn_valid(digits)


def _phone(match: str) -> bool:
    digits = _digits(match)
    if match.startswith("+"):
        return 8 <= len(digits) <= 15
    # Without a country code: a national number of 10 or 11 digits (NANP,
    # most of Europe with its trunk 0); shorter runs are too often not phones.
    return len(digits) in (10, 11)


def _ssn(match: str) -> bool:
    area, group, serial = match.replace(" ", "-").split("-")
    return area not in ("000", "666") and area[0] != "9" and group != "00" and serial != "0000"


# UK National Insurance prefixes never issued.
_NINO_NOT_ISSUED = frozenset({"BG", "GB", "KN", "NK", "NT", "TN", "ZZ"})


def _nino(match: str) -> bool:
    return match[:2] not in _NINO_NOT_ISSUED


def _iban(match: str) -> bool:
    compact = match.replace(" ", "").upper()
    rearranged = compact[4:] + compact[:4]
    number = "".join(str(int(ch, 36)) for ch in rearranged)
    return 15 <= len(compact) <= 34 and int(number) % 97 == 1


@dataclass(slots=True, frozen=True)
class Recognizer:
    entity: str
    pattern: LinearPattern
    valid: Callable[[str], bool] = lambda _: True


D = DIGIT
RECOGNIZERS: tuple[Recognizer, ...] = (
    Recognizer(
        "EMAIL_ADDRESS",
        LinearPattern(
            r"[A-Za-z0-9._%+-]+@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*\.[A-Za-z]{2,}",
            before=WORD + ".+-",
            after=WORD,
        ),
    ),
    Recognizer(
        "CREDIT_CARD",
        LinearPattern(rf"{D}(?:[ -]?{D}){{12,18}}", before=D + "-", after=D + "-"),
        _card,
    ),
    Recognizer(
        "IBAN_CODE",
        LinearPattern(rf"[A-Z]{{2}}{D}{{2}}(?: ?[A-Z0-9]){{11,30}}", before=WORD, after=WORD),
        _iban,
    ),
    Recognizer(
        "US_SSN",
        LinearPattern(
            rf"{D}{{3}}-{D}{{2}}-{D}{{4}}|{D}{{3}} {D}{{2}} {D}{{4}}", before=D + "-", after=D + "-"
        ),
        _ssn,
    ),
    # UK National Insurance number: two letters (never D, F, I, Q, U, V; O
    # not second; not the prefixes _NINO_NOT_ISSUED), six digits, A to D.
    Recognizer(
        "UK_NINO",
        LinearPattern(
            rf"[A-CEGHJ-PR-TW-Z][A-CEGHJ-NPR-TW-Z] ?{D}{{2}} ?{D}{{2}} ?{D}{{2}} ?[A-D]",
            before=WORD,
            after=WORD,
        ),
        _nino,
    ),
    Recognizer(
        "PHONE_NUMBER",
        LinearPattern(
            rf"(?:\+{D}{{1,3}}[ .-]?)?(?:\({D}{{1,4}}\)[ .-]?)?{D}{{2,4}}(?:[ .-]?{D}{{2,4}}){{1,4}}",
            before=WORD + "+",
            after=WORD,
        ),
        _phone,
    ),
)


def pii_find(text: str) -> list[Finding]:
    """Non-overlapping PII spans in ``text``, earlier recognizers first on overlap.

    The order of RECOGNIZERS is the priority: a valid card number is not
    also reported as a phone number. Linear in the text and the findings:
    each recognizer's spans come in order, so they are checked against
    the spans taken before by one walk.
    """
    taken: list[tuple[int, int]] = []  # sorted, non-overlapping
    found: list[Finding] = []
    for recognizer in RECOGNIZERS:
        added: list[tuple[int, int]] = []
        k = 0
        for start, end in recognizer.pattern.spans(text):
            while k < len(taken) and taken[k][1] <= start:
                k += 1
            if k < len(taken) and taken[k][0] < end:
                continue
            if not recognizer.valid(text[start:end]):
                continue
            added.append((start, end))
            found.append(Finding(PII, recognizer.entity, 1.0, start, end))
        taken = list(heapq.merge(taken, added))
    return sorted(found, key=lambda f: f.start)


def pii_redact(text: str, findings: list[Finding] | None = None) -> str:
    """``text`` with each PII span replaced by ``<ENTITY>``."""
    findings = pii_find(text) if findings is None else findings
    out, last = [], 0
    for f in sorted(findings, key=lambda f: f.start):
        out.append(text[last : f.start])
        out.append(f"<{f.category}>")
        last = f.end
    out.append(text[last:])
    return "".join(out)


class PiiCheck:
    name = PII

    def run(self, texts: list[str]) -> list[list[Finding]]:
        return [pii_find(t) for t in texts]
