"""Linear-time pattern matching for user text (google-re2).

Python's ``re`` backtracks: one crafted prompt (100,000 ``%`` against the
e-mail pattern) took 14 s, holding the GIL. RE2 runs in time linear in the
text, whatever the pattern, but has no lookaround and no backreferences.
``LinearPattern`` gives back the one lookaround the checks use, a character
class that must not touch the match on either side ("whole word", "not
inside a longer number"), by matching that context character and reporting
the span of the match itself:

    (?:^|[^ctx])( body )(?:$|[^ctx])

Each search restarts where the previous *match* (not its trailing context
character) ended, so the character after one match can be the character
before the next, as with a lookbehind. The text is encoded to UTF-8 once
and searched as bytes (the str API re-encodes the whole text on every
``search``); byte offsets are turned back into ``str`` offsets in one pass.

Classes follow Python's ``str`` semantics where they matter: ``WORD`` is
``[\\p{L}\\p{N}_]`` (``\\w``), ``DIGIT`` is ``\\p{Nd}`` (``\\d``); RE2's own
``\\w``, ``\\d`` and ``\\b`` are ASCII only.
"""

from __future__ import annotations

from collections.abc import Iterator

import re2

WORD = r"\p{L}\p{N}_"
DIGIT = r"\p{Nd}"
# A big deny list compiles to a big automaton; RE2's default (8 MiB) would
# refuse about 50,000 terms. Per pattern, memory only.
_MAX_MEM = 64 << 20


class LinearPattern:
    """``body``, with characters of ``before`` / ``after`` (class contents,
    as inside ``[...]``) forbidden right before / after it; None: no
    condition on that side.

    ``body`` must hold no capturing group: group 1 is the match.
    """

    __slots__ = ("_regex", "_inner", "_context", "pattern")

    def __init__(
        self,
        body: str,
        *,
        before: str | None = None,
        after: str | None = None,
        ignore_case: bool = False,
    ) -> None:
        tail = f"(?:$|[^{after}])" if after is not None else ""
        self.pattern = f"(?:^|[^{before}])({body}){tail}" if before else f"({body}){tail}"
        options = re2.Options()
        options.case_sensitive = not ignore_case
        options.max_mem = _MAX_MEM
        self._regex = re2.compile(self.pattern.encode("utf-8"), options)
        # For a search that starts past the text's start: the character
        # before the window is the context, never the start of the text.
        inner = f"[^{before}]({body}){tail}" if before else self.pattern
        self._inner = re2.compile(inner.encode("utf-8"), options)
        self._context = bool(before)

    def spans(self, text: str, start: int = 0, end: int | None = None) -> Iterator[tuple[int, int]]:
        """The (start, end) offsets in ``text`` of each non-overlapping match
        inside ``text[start:end]``. As with Python's ``pos`` and ``endpos``,
        the character before ``start`` counts as context, and the text is
        taken to end at ``end``.
        """
        if end is not None and end < len(text):
            # As Python's ``endpos``: the text ends there, for the context too.
            text = text[:end]
        end = len(text)
        encoded = text.encode("utf-8", "surrogatepass")
        offsets = _Offsets(text, encoded)
        stop = len(encoded)
        if start > 0 and self._context:
            # The character before the window, as a lookbehind sees it.
            pos, regex = offsets.to_byte(start - 1), self._inner
        else:
            pos, regex = offsets.to_byte(start), self._regex
        while pos <= stop:
            m = regex.search(encoded, pos, stop)
            if m is None:
                return
            first, last = m.span(1)
            char = offsets.to_char(first)
            yield char, offsets.to_char(last)
            if last == first:
                # An empty match: step over one character to make progress.
                if first == stop:
                    return
                last += len(text[char].encode("utf-8", "surrogatepass"))
            # On from the match's end: its trailing context character may be
            # the next match's leading one. Past the start "^" cannot match.
            pos, regex = last, self._inner

    def search(self, text: str, start: int = 0, end: int | None = None) -> tuple[int, int] | None:
        """The first match's span, or None (see ``spans``)."""
        return next(self.spans(text, start, end), None)


class _Offsets:
    """Byte <-> str offsets of one text and its UTF-8, for offsets that
    mostly grow (each conversion goes on from the last, in C): linear over
    a whole search."""

    __slots__ = ("_text", "_encoded", "_byte", "_char")

    def __init__(self, text: str, encoded: bytes) -> None:
        self._text = text
        self._encoded = encoded
        self._byte = 0
        self._char = 0

    def to_char(self, byte: int) -> int:
        if byte < self._byte:
            self._byte = self._char = 0
        self._char += len(self._encoded[self._byte : byte].decode("utf-8", "surrogatepass"))
        self._byte = byte
        return self._char

    def to_byte(self, char: int) -> int:
        if char < self._char:
            self._byte = self._char = 0
        self._byte += len(self._text[self._char : char].encode("utf-8", "surrogatepass"))
        self._char = char
        return self._byte
