"""Speculative decoding end to end on the demo model (float32).

Greedy and seeded outputs with speculation equal those without, through
prefix caching, preemption, stops inside an accepted run, min_tokens,
n > 1, logprobs and streaming; the pool is whole afterwards. In float32
the model's rows do not depend on the batch shape beyond the last bits;
the deterministic-mode test checks the very same bits.
"""

from __future__ import annotations

import pytest

from gpuworkers.engine import SamplingParams
from gpuworkers.engine.prefix_cache import hash_full_blocks
from tokenization.tokenizer import apply_chat_template

# Several whole replies per test on a shared 2-core machine.
pytestmark = pytest.mark.timeout(900)

PASSAGE = (
    "The old lighthouse stood on the northern cliff for more than a century. Every night "
    "its keeper climbed the spiral stairs, trimmed the wick and wound the clockwork that "
    "turned the great lens. Ships passing the reef learned to trust its steady beam."
)


@pytest.fixture(scope="module")
def copy_prompt(tokenizer):
    """A prompt whose reply repeats it: prompt lookup's best case."""
    message = "Repeat this text exactly:\n\n" + PASSAGE
    return apply_chat_template(tokenizer, [{"role": "user", "content": message}])


def stream(engine, requests, earlier: list[list[int]] = ()) -> dict:
    """Run (id, prompt ids, params) to the end with step(); per request and
    choice: tokens, streamed text, finish reason, logprobs, the most
    tokens one step delivered; and the request's spec counts."""
    for request_id, prompt, params in requests:
        engine.add_request(request_id, prompt, params)
    results: dict = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            entry = results.setdefault(out.request_id, {})
            entry["spec"] = (out.num_draft_tokens, out.num_accepted_tokens)
            for delta in out.choices:
                choice = entry.setdefault(delta.index, {"tokens": [], "text": "", "lp": []})
                choice["tokens"] += delta.token_ids
                choice["text"] += delta.text
                choice["lp"] += [round(lp.logprob, 3) for lp in delta.logprobs or []]
                choice["finish"] = delta.finish_reason
                choice["burst"] = max(choice.get("burst", 0), len(delta.token_ids))
    assert_pool_whole(engine, [prompt for _, prompt, _ in requests], results, earlier)
    return results


def assert_pool_whole(engine, prompts, results, earlier=()) -> None:
    """Every block free again, and the prefix cache holds only blocks of
    verified tokens: prompts and emitted outputs (and ``earlier`` runs'
    prompt + output ids), never a rejected draft."""
    kv = engine.kv
    kv.allocator.check_invariants()
    assert kv.num_free == kv.num_total and not engine.scheduler.seqs
    verified = set()
    for ids in earlier:
        verified |= set(hash_full_blocks(ids, kv.block_size, "demo", None))
    for prompt, entry in zip(prompts, results.values(), strict=True):
        for choice in (c for key, c in entry.items() if key != "spec"):
            verified |= set(
                hash_full_blocks(prompt + choice["tokens"], kv.block_size, "demo", None)
            )
    assert set(kv.allocator._cached) <= verified


def without_spec(entry: dict) -> dict:
    return {
        k: {f: v for f, v in c.items() if f != "burst"} for k, c in entry.items() if k != "spec"
    }


def test_greedy_equals_plain_decoding_with_preemption_penalties_and_logprobs(
    make_engine, copy_prompt, chat_prompts, tokenizer
):
    prompts = [copy_prompt, chat_prompts[2], copy_prompt]
    greedy = SamplingParams(max_tokens=40, temperature=0.0, logprobs=True, top_logprobs=2)
    penalised = SamplingParams(
        max_tokens=40, temperature=0.0, repetition_penalty=1.3, frequency_penalty=0.4
    )
    requests = [("copy", prompts[0], greedy), ("chat", prompts[1], greedy)]
    requests.append(("penalised", prompts[2], penalised))
    plain = stream(make_engine(speculative_method=None), requests)
    # A pool too small for all three: sequences are swapped out and back.
    engine = make_engine(num_kv_blocks=12, admission_policy="optimistic")
    spec = stream(engine, requests)
    stats = engine.stats()
    assert stats["swaps_out"] > 0
    assert {name: without_spec(spec[name]) for name in spec} == {
        name: without_spec(plain[name]) for name in plain
    }
    drafted, accepted = spec["copy"]["spec"]
    assert accepted > 20 and drafted >= accepted
    assert spec["copy"][0]["burst"] > 1  # several tokens in one streamed delta
    assert stats["spec_accepted_tokens"] >= accepted
    assert plain["copy"]["spec"] == (0, 0)


def test_stops_inside_an_accepted_run_end_the_reply_where_plain_decoding_does(
    make_engine, copy_prompt, tokenizer
):
    plain_engine = make_engine(speculative_method=None)
    (reply,) = plain_engine.generate([copy_prompt], SamplingParams(max_tokens=120, temperature=0.0))
    assert reply.finish_reason == "stop"  # EOS after the copy
    wick = tokenizer(" wick", add_special_tokens=False).input_ids[-1]
    assert wick in reply.token_ids
    base = {"temperature": 0.0}
    requests = [
        ("string", copy_prompt, SamplingParams(max_tokens=120, stop=["spiral"], **base)),
        ("token", copy_prompt, SamplingParams(max_tokens=120, stop_token_ids=[wick], **base)),
        ("length", copy_prompt, SamplingParams(max_tokens=13, ignore_eos=True, **base)),
        # EOS held off past the natural end: drafts straddle min_tokens.
        (
            "min",
            copy_prompt,
            SamplingParams(
                max_tokens=len(reply.token_ids) + 6, min_tokens=len(reply.token_ids) + 3, **base
            ),
        ),
    ]
    # The plain engine again: its prefix cache holds the prompt.
    plain = stream(plain_engine, requests, [copy_prompt + reply.token_ids])
    spec_requests = [("eos", copy_prompt, SamplingParams(max_tokens=120, **base)), *requests]
    spec = stream(make_engine(), spec_requests)
    for name in plain:
        assert without_spec(spec[name]) == without_spec(plain[name]), name
        assert spec[name]["spec"][1] > 0, name
    assert spec["string"][0]["finish"] == "stop" and "spiral" not in spec["string"][0]["text"]
    assert spec["token"][0]["tokens"][-1] == wick and spec["token"][0]["finish"] == "stop"
    assert len(spec["length"][0]["tokens"]) == 13 and spec["length"][0]["finish"] == "length"
    assert spec["eos"][0]["tokens"] == reply.token_ids
    assert spec["eos"][0]["text"] == reply.text and spec["eos"][0]["finish"] == "stop"
    assert len(spec["min"][0]["tokens"]) >= len(reply.token_ids) + 3


def test_seeded_sampling_with_n_choices_equals_plain_decoding(make_engine, copy_prompt):
    params = SamplingParams(max_tokens=30, temperature=0.5, seed=11, n=2, logprobs=True)
    requests = [("sampled", copy_prompt, params)]
    plain = stream(make_engine(speculative_method=None), requests)["sampled"]
    spec = stream(make_engine(), requests)["sampled"]
    assert without_spec(spec) == without_spec(plain)
    assert spec["spec"][1] > 0
    vocab = make_engine().model_cfg.vocab_size
    assert all(0 <= t < vocab for c in (0, 1) for t in spec[c]["tokens"])
    assert len(spec[0]["tokens"]) == len(spec[1]["tokens"]) == 30 or spec[0]["finish"] == "stop"


def test_deterministic_mode_gives_the_same_bits_with_and_without_speculation(
    make_engine, copy_prompt
):
    greedy = SamplingParams(max_tokens=16, temperature=0.0, logprobs=True, top_logprobs=2)
    seeded = SamplingParams(max_tokens=16, temperature=0.8, top_p=0.9, seed=7, logprobs=True)
    requests = [("greedy", copy_prompt, greedy), ("seeded", copy_prompt, seeded)]

    def exact(engine) -> dict:
        outputs = engine.generate([r[1] for r in requests], [r[2] for r in requests])
        view = {}
        for (name, _, _), out in zip(requests, outputs, strict=True):
            bits = [(lp.token_id, lp.logprob.hex()) for lp in out.choices[0].logprobs]
            view[name] = (out.token_ids, bits, out.num_accepted_tokens)
        return view

    plain = exact(make_engine(deterministic=True, speculative_method=None))
    spec = exact(make_engine(deterministic=True))
    assert {k: v[:2] for k, v in spec.items()} == {k: v[:2] for k, v in plain.items()}
    assert spec["greedy"][2] > 0
