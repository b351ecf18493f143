"""Incremental detokenization that never emits broken UTF-8 or stop strings.

Each new token decodes a short window of ids (a few tokens of context plus
the unread ones); text is released only once it no longer ends in a partial
UTF-8 character, and the last ``len(longest stop) - 1`` characters are held
back until no stop string can start inside them.
"""

from __future__ import annotations

# Prompt tokens kept as context so tokenizers that drop a leading space at
# the start of a decode (SentencePiece) render the first output token right.
CONTEXT_TOKENS = 5
REPLACEMENT_CHAR = "\ufffd"


class IncrementalDetokenizer:
    def __init__(self, tokenizer, prompt_ids: list[int], stop: list[str]):
        self._decode = _fast_decoder(tokenizer)
        self._ids = list(prompt_ids[-CONTEXT_TOKENS:])
        self._prefix_offset = 0
        self._read_offset = len(self._ids)
        self.text = ""  # all output text decoded so far (may exceed what is emitted)
        self._emitted = 0
        self._stop = stop
        self._holdback = max((len(s) for s in stop), default=1) - 1
        self.stopped = False  # a stop string was found

    def add(self, token_id: int) -> str:
        """Feed one token; return the text that became safe to emit."""
        if self.stopped:
            return ""
        self._ids.append(token_id)
        prefix = self._decode(self._ids[self._prefix_offset : self._read_offset])
        full = self._decode(self._ids[self._prefix_offset :])
        if len(full) > len(prefix) and not full.endswith(REPLACEMENT_CHAR):
            self.text += full[len(prefix) :]
            self._prefix_offset = self._read_offset
            self._read_offset = len(self._ids)
        if self._stop:
            # A stop string can only begin in text not yet checked.
            search_from = max(0, self._emitted - self._holdback)
            cut = _find_stop(self.text, self._stop, search_from)
            if cut is not None:
                self.text = self.text[:cut]
                self.stopped = True
                return self._release(len(self.text))
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


def _find_stop(text: str, stops: list[str], start: int) -> int | None:
    positions = [p for p in (text.find(s, start) for s in stops) if p != -1]
    return min(positions) if positions else None


def _fast_decoder(tokenizer):
    """Decode through the Rust tokenizer directly when available (much cheaper)."""
    backend = getattr(tokenizer, "_tokenizer", None) or getattr(
        tokenizer, "backend_tokenizer", None
    )
    if backend is not None and hasattr(backend, "decode"):
        return lambda ids: backend.decode(ids, skip_special_tokens=True)
    return lambda ids: tokenizer.decode(ids, skip_special_tokens=True)
