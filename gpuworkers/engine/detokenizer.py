"""Incremental detokenization that never emits broken UTF-8 or stop strings.

Each new token decodes a short window of ids (a few tokens of context plus
the unread ones); text is released only once it no longer ends in a partial
UTF-8 character, and the last ``len(longest stop) - 1`` characters are held
back until no stop string can start inside them. Whoever ends the sequence
for another reason (EOS, a stop token id, length) calls ``flush()`` for
that held-back tail.
"""

from __future__ import annotations

# Prompt tokens kept as context so tokenizers that drop a leading space at
# the start of a decode (SentencePiece) render the first output token right.
CONTEXT_TOKENS = 5
REPLACEMENT_CHAR = "\ufffd"


class IncrementalDetokenizer:
    """One choice's output text.

    Args:
        stop: stop strings; the text ends before the first one found (or
            after it with ``include_stop_str``).
        skip_special_tokens: leave special tokens (EOS, chat markers) out
            of the text.
        min_tokens: stop strings are honoured only in text decoded after
            this many tokens (a stop string that ends earlier does not
            count), as vLLM does.
    """

    def __init__(
        self,
        tokenizer,
        prompt_ids: list[int],
        stop: list[str],
        *,
        skip_special_tokens: bool = True,
        include_stop_str: bool = False,
        min_tokens: int = 0,
    ):
        self._decode = _fast_decoder(tokenizer, skip_special_tokens)
        self._ids = list(prompt_ids[-CONTEXT_TOKENS:])
        self._prefix_offset = 0
        self._read_offset = len(self._ids)
        self.text = ""  # all output text decoded so far (may exceed what is emitted)
        self._emitted = 0
        self._stop = stop
        self._include_stop = include_stop_str
        # Kept text always ends a stop string when it is included, so
        # nothing needs holding back then.
        longest = max((len(s) for s in stop), default=1)
        self._holdback = 0 if include_stop_str else longest - 1
        self._min_tokens = min_tokens
        self._num_tokens = 0
        # Text already searched for stop strings (or exempt by min_tokens).
        self._checked = 0
        self.stopped = False  # a stop string was found

    def add(self, token_id: int) -> str:
        """Feed one token; return the text that became safe to emit."""
        if self.stopped:
            return ""
        self._num_tokens += 1
        self._ids.append(token_id)
        prefix = self._decode(self._ids[self._prefix_offset : self._read_offset])
        full = self._decode(self._ids[self._prefix_offset :])
        if len(full) > len(prefix) and not full.endswith(REPLACEMENT_CHAR):
            self.text += full[len(prefix) :]
            self._prefix_offset = self._read_offset
            self._read_offset = len(self._ids)
        if self._stop and self._num_tokens > self._min_tokens:
            found = _find_stop(self.text, self._stop, self._checked)
            if found is not None:
                start, stop = found
                self.text = self.text[: start + len(stop) if self._include_stop else start]
                self.stopped = True
                return self._release(len(self.text))
        self._checked = len(self.text)
        return self._release(len(self.text) - self._holdback)

    def flush(self) -> str:
        """The held-back tail, once the sequence ends for another reason."""
        return self._release(len(self.text))

    def _release(self, upto: int) -> str:
        if upto <= self._emitted:
            return ""
        chunk = self.text[self._emitted : upto]
        self._emitted = upto
        return chunk


def _find_stop(text: str, stops: list[str], checked: int) -> tuple[int, str] | None:
    """The earliest stop string that ends in the text past ``checked``."""
    best = None
    for stop in stops:
        # It may begin in checked text, but must end after it.
        position = text.find(stop, max(0, checked - len(stop) + 1))
        if position != -1 and (best is None or position < best[0]):
            best = (position, stop)
    return best


def _fast_decoder(tokenizer, skip_special_tokens: bool = True):
    """Decode through the Rust tokenizer directly when available (much cheaper)."""
    backend = getattr(tokenizer, "_tokenizer", None) or getattr(
        tokenizer, "backend_tokenizer", None
    )
    if backend is not None and hasattr(backend, "decode"):
        return lambda ids: backend.decode(ids, skip_special_tokens=skip_special_tokens)
    return lambda ids: tokenizer.decode(ids, skip_special_tokens=skip_special_tokens)
