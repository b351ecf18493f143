"""Tenant-defined deny lists: words and phrases matched as whole words.

Case-insensitive; the words of a phrase may be separated by any run of
whitespace. One alternation regex per list, longest terms first, compiled
once per distinct list (lists change rarely, requests reuse them), run in
linear time by RE2 (``safety.checks.linear``): terms are tenant text and
prompts user text, so no backtracking engine sees either.
"""

from __future__ import annotations

import functools

import re2

from safety.checks import DENY_LIST, Finding
from safety.checks.linear import WORD, LinearPattern

MAX_TERM_CHARS = 100
# Python's whitespace (str.isspace): RE2's \s is ASCII only.
SPACE = r"[\s\v\p{Z}\x{1C}-\x{1F}\x{85}]"


def normalize_terms(raw: str | list[str] | tuple[str, ...]) -> tuple[str, ...]:
    """Terms from text (one per line) or a list: stripped, deduplicated, in order."""
    lines = raw.splitlines() if isinstance(raw, str) else list(raw)
    seen: dict[str, str] = {}
    for line in lines:
        term = " ".join(line.split())
        if term and term.casefold() not in seen:
            seen[term.casefold()] = term
    return tuple(seen.values())


@functools.lru_cache(maxsize=256)
def compile_terms(terms: tuple[str, ...]) -> LinearPattern | None:
    if not terms:
        return None
    parts = [
        f"{SPACE}+".join(re2.escape(word) for word in term.split())
        for term in sorted(terms, key=len, reverse=True)
    ]
    # Whole words: no word character right before or after the term.
    return LinearPattern("|".join(parts), before=WORD, after=WORD, ignore_case=True)


class DenyList:
    """A compiled list; ``find`` reports each occurrence."""

    __slots__ = ("terms", "pattern", "longest")

    def __init__(self, terms: tuple[str, ...]):
        self.terms = terms
        self.pattern = compile_terms(terms)
        self.longest = max((len(t) for t in terms), default=0)

    def __bool__(self) -> bool:
        return self.pattern is not None

    def find(self, text: str) -> list[Finding]:
        if self.pattern is None:
            return []
        return [
            Finding(DENY_LIST, text[start:end].lower(), 1.0, start, end)
            for start, end in self.pattern.spans(text)
        ]

    def first(self, text: str, start: int = 0, end: int | None = None) -> Finding | None:
        """The first occurrence in ``text[start:end]``; the words around it still count.

        The match must end at a word boundary of the whole text, so ``end``
        must be one (a search that stops inside a word would see its end).
        """
        if self.pattern is None:
            return None
        span = self.pattern.search(text, start, end)
        if span is None:
            return None
        return Finding(DENY_LIST, text[span[0] : span[1]].lower(), 1.0, *span)

    def run(self, texts: list[str]) -> list[list[Finding]]:
        return [self.find(t) for t in texts]
