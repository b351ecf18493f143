"""PII recognizers: emails, phone numbers, card numbers, national ids, IBANs.

Our own, not presidio's: presidio-analyzer's pattern recognizers are
reachable without a language model, but the package pulls in spaCy (and its
AnalyzerEngine wants a spaCy model download), which is far more than a few
regular expressions need. Entity names follow presidio's, so a later switch
keeps the same labels. Each recognizer is a pattern plus a validator that
throws out what the pattern over-matches (Luhn for cards, mod 97 for IBANs,
the ranges never issued for US SSNs).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from safety.checks import PII, Finding


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
    area, group, serial = re.split(r"[- ]", match)
    return area not in ("000", "666") and area[0] != "9" and group != "00" and serial != "0000"


def _iban(match: str) -> bool:
    compact = match.replace(" ", "").upper()
    rearranged = compact[4:] + compact[:4]
    number = "".join(str(int(ch, 36)) for ch in rearranged)
    return 15 <= len(compact) <= 34 and int(number) % 97 == 1


@dataclass(slots=True, frozen=True)
class Recognizer:
    entity: str
    pattern: re.Pattern[str]
    valid: Callable[[str], bool] = lambda _: True


RECOGNIZERS: tuple[Recognizer, ...] = (
    Recognizer(
        "EMAIL_ADDRESS",
        re.compile(
            r"(?<![\w.+-])[A-Za-z0-9._%+-]+@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*\.[A-Za-z]{2,}\b"
        ),
    ),
    Recognizer("CREDIT_CARD", re.compile(r"(?<![\d-])\d(?:[ -]?\d){12,18}(?![\d-])"), _card),
    Recognizer("IBAN_CODE", re.compile(r"\b[A-Z]{2}\d{2}(?: ?[A-Z0-9]){11,30}\b"), _iban),
    Recognizer("US_SSN", re.compile(r"(?<![\d-])\d{3}([- ])\d{2}\1\d{4}(?![\d-])"), _ssn),
    # UK National Insurance number: two letters (never D, F, I, Q, U, V; O
    # not second; not BG, GB, KN, NK, NT, TN, ZZ), six digits, A to D.
    Recognizer(
        "UK_NINO",
        re.compile(
            r"\b(?!BG|GB|KN|NK|NT|TN|ZZ)[A-CEGHJ-PR-TW-Z][A-CEGHJ-NPR-TW-Z]"
            r" ?\d{2} ?\d{2} ?\d{2} ?[A-D]\b"
        ),
    ),
    Recognizer(
        "PHONE_NUMBER",
        re.compile(
            r"(?<![\w+])(?:\+\d{1,3}[ .-]?)?(?:\(\d{1,4}\)[ .-]?)?\d{2,4}(?:[ .-]?\d{2,4}){1,4}(?!\w)"
        ),
        _phone,
    ),
)


def pii_find(text: str) -> list[Finding]:
    """Non-overlapping PII spans in ``text``, earlier recognizers first on overlap.

    The order of RECOGNIZERS is the priority: a valid card number is not
    also reported as a phone number.
    """
    taken: list[tuple[int, int]] = []
    found: list[Finding] = []
    for recognizer in RECOGNIZERS:
        for m in recognizer.pattern.finditer(text):
            start, end = m.span()
            if any(start < e and s < end for s, e in taken) or not recognizer.valid(m.group()):
                continue
            taken.append((start, end))
            found.append(Finding(PII, recognizer.entity, 1.0, start, end))
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
