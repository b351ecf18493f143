"""Incremental detokenization: UTF-8 safe and never past a stop string."""

from gpuworkers.engine.detokenizer import IncrementalDetokenizer


def stream(tokenizer, text, stop=()):
    ids = tokenizer(text, add_special_tokens=False).input_ids
    detok = IncrementalDetokenizer(tokenizer, [1, 9690, 198], list(stop))
    pieces = [detok.add(t) for t in ids]
    if not detok.stopped:
        pieces.append(detok.flush())
    return pieces, detok


def test_pieces_join_to_the_full_text(tokenizer):
    text = "Hello world, this is a test of streaming."
    pieces, _ = stream(tokenizer, text)
    assert "".join(pieces) == text


def test_multibyte_characters_are_never_split(tokenizer):
    text = "Emoji 🎉🚀 and accents: café, naïve, 日本語."
    pieces, _ = stream(tokenizer, text)
    assert "".join(pieces) == text
    assert all("\ufffd" not in p for p in pieces)


def test_stop_string_is_never_emitted(tokenizer):
    text = "one two three STOP four five"
    pieces, detok = stream(tokenizer, text, stop=["STOP"])
    joined = "".join(pieces)
    assert detok.stopped
    assert joined == "one two three "
    assert "STOP" not in joined and "ST" not in joined[-3:]
