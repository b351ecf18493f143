"""Incremental detokenization: UTF-8 safe and never past a stop string."""

from gpuworkers.engine.detokenizer import IncrementalDetokenizer
from gpuworkers.engine.sampling_params import SamplingParams


def stream(tokenizer, text, stop=(), **options):
    ids = tokenizer(text, add_special_tokens=False).input_ids
    detok = IncrementalDetokenizer(tokenizer, [1, 9690, 198], list(stop), **options)
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


def test_include_stop_str_keeps_the_stop_string_and_nothing_after(tokenizer):
    pieces, detok = stream(tokenizer, "one two STOP. three", stop=["STOP"], include_stop_str=True)
    assert detok.stopped and "".join(pieces) == "one two STOP"


def test_stop_strings_count_only_after_min_tokens(tokenizer):
    text = "one STOP two STOP three"
    ids = tokenizer(text, add_special_tokens=False).input_ids
    first_stop_ends = next(
        i + 1 for i in range(len(ids)) if "STOP" in tokenizer.decode(ids[: i + 1])
    )
    pieces, detok = stream(tokenizer, text, stop=["STOP"], min_tokens=first_stop_ends)
    assert detok.stopped and "".join(pieces) == "one STOP two "
    pieces, _ = stream(tokenizer, text, stop=["STOP"], min_tokens=first_stop_ends - 1)
    assert "".join(pieces) == "one "


def test_special_tokens_are_kept_on_request(tokenizer):
    ids = tokenizer("Hi", add_special_tokens=False).input_ids + [2]  # 2: <|im_end|>
    kept = IncrementalDetokenizer(tokenizer, [1], [], skip_special_tokens=False)
    skipped = IncrementalDetokenizer(tokenizer, [1], [])
    kept_text = "".join(kept.add(t) for t in ids) + kept.flush()
    skipped_text = "".join(skipped.add(t) for t in ids) + skipped.flush()
    assert (kept_text, skipped_text) == ("Hi<|im_end|>", "Hi")


# Through the engine -----------------------------------------------------

GREEDY = {"max_tokens": 64, "temperature": 0.0}
UNMATCHED_STOP = ["<never in this reply>"]


def test_reply_ending_on_eos_keeps_the_text_held_back_for_stop_strings(
    make_engine, chat_prompts, tokenizer
):
    """Bug 1: with ``stop`` set, a reply that ends on EOS used to lose the
    last len(stop) - 1 characters (held back, never flushed)."""
    engine = make_engine()
    plain = engine.generate([chat_prompts[0]], SamplingParams(**GREEDY))[0]
    assert plain.finish_reason == "stop" and plain.token_ids[-1] in engine.eos_token_ids
    held = engine.generate([chat_prompts[0]], SamplingParams(**GREEDY, stop=UNMATCHED_STOP))[0]
    assert held.token_ids == plain.token_ids
    assert held.text == plain.text == tokenizer.decode(plain.token_ids, skip_special_tokens=True)


def test_reply_ending_on_a_stop_token_id_keeps_the_held_back_text(
    make_engine, chat_prompts, tokenizer
):
    engine = make_engine()
    plain = engine.generate([chat_prompts[0]], SamplingParams(**GREEDY))[0]
    ids = plain.token_ids
    # A token that first occurs after more text than the stop string holds back.
    cut = next(
        i
        for i, t in enumerate(ids[:-1])
        if t not in ids[:i] and len(tokenizer.decode(ids[:i])) > len(UNMATCHED_STOP[0])
    )
    params = SamplingParams(**GREEDY, stop=UNMATCHED_STOP, stop_token_ids=[plain.token_ids[cut]])
    held = engine.generate([chat_prompts[0]], params)[0]
    assert held.finish_reason == "stop"
    assert held.token_ids == plain.token_ids[: cut + 1]
    assert held.text == tokenizer.decode(plain.token_ids[:cut], skip_special_tokens=True)
