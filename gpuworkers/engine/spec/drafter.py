"""N-gram (prompt lookup) drafting: no second model.

The last n tokens of a sequence (n from ``max_n`` down to ``min_n``) are
looked up earlier in its prompt and output; the tokens that followed the
most recent earlier occurrence are the draft. Replies that quote, copy or
edit their prompt (summaries, code edits, extraction) repeat long runs of
it, and then most drafts are right.
"""

from __future__ import annotations

from array import array

# Bytes per token id in the search buffer: bytes.rfind runs in C, and a
# match is kept only at a multiple of this offset (a whole token).
_WIDTH = array("q").itemsize


class NgramDrafter:
    """Proposes up to ``k`` tokens by n-gram lookup.

    Args:
        min_n, max_n: n-gram lengths tried, longest first (a longer match
            is better evidence that the continuation repeats too).
        k: most tokens proposed.
    """

    __slots__ = ("min_n", "max_n", "k")

    def __init__(self, min_n: int, max_n: int, k: int):
        if not 1 <= min_n <= max_n or k < 1:
            raise ValueError("need 1 <= min_n <= max_n and k >= 1")
        self.min_n = min_n
        self.max_n = max_n
        self.k = k

    def propose(self, token_ids: list[int], k: int | None = None) -> list[int]:
        """The draft after ``token_ids`` (empty when no n-gram recurs).

        An occurrence must end before the last token (so at least one
        token follows it, and the suffix never matches itself); the most
        recent one wins.
        """
        k = self.k if k is None else min(k, self.k)
        length = len(token_ids)
        if k < 1 or length < self.min_n + 1:
            return []
        # Every candidate occurrence lies in token_ids[:-1]: one buffer.
        haystack = array("q", token_ids[:-1]).tobytes()
        for n in range(min(self.max_n, length - 1), self.min_n - 1, -1):
            needle = array("q", token_ids[-n:]).tobytes()
            end = len(haystack)
            while (found := haystack.rfind(needle, 0, end)) != -1:
                if found % _WIDTH == 0:
                    start = found // _WIDTH + n
                    return token_ids[start : start + k]
                # A match across token boundaries: look further left.
                end = found + len(needle) - 1
        return []
