"""Sampling parameters through the engine, on the float32 demo model."""

import pytest
import torch

from gpuworkers.engine import InvalidSamplingParams, SamplingParams

GREEDY = {"max_tokens": 48, "temperature": 0.0}


@pytest.fixture(scope="module")
def greedy_reply(make_engine, chat_prompts):
    """The plain greedy reply to prompt 0 (it ends on EOS)."""
    out = make_engine().generate([chat_prompts[0]], SamplingParams(**GREEDY))[0]
    assert out.finish_reason == "stop"
    return out


def test_prompt_logprobs_match_a_full_forward_pass(make_engine, chat_prompts, demo_dir):
    """Chunked prefill or not, each prompt token's logprob is the model's
    log-softmax at the position before it, and they arrive once."""
    from transformers import AutoModelForCausalLM

    prompt = chat_prompts[4]
    model = AutoModelForCausalLM.from_pretrained(str(demo_dir), dtype=torch.float32)
    with torch.inference_mode():
        reference = torch.log_softmax(model(torch.tensor([prompt])).logits[0].float(), -1)
    params = SamplingParams(max_tokens=3, temperature=0.0, prompt_logprobs=2)
    for budget in (2048, 7):
        engine = make_engine(max_num_batched_tokens=budget)
        engine.add_request("r", prompt, params)
        carried = []
        while engine.has_unfinished_requests():
            carried += [o.prompt_logprobs for o in engine.step() if o.prompt_logprobs is not None]
        assert len(carried) == 1, "prompt logprobs come once"
        entries = carried[0]
        assert len(entries) == len(prompt) and entries[0] is None
        for position, entry in enumerate(entries[1:]):
            expected = reference[position]
            assert entry.token_id == prompt[position + 1]
            assert entry.logprob == pytest.approx(float(expected[entry.token_id]), abs=2e-4)
            assert [t for t, _, _ in entry.top] == expected.topk(2).indices.tolist()


def test_min_tokens_holds_off_eos(make_engine, chat_prompts, greedy_reply):
    at_least = len(greedy_reply.token_ids) + 4
    params = SamplingParams(**{**GREEDY, "max_tokens": at_least + 20}, min_tokens=at_least)
    out = make_engine().generate([chat_prompts[0]], params)[0]
    eos = set(make_engine().eos_token_ids)
    assert len(out.token_ids) >= at_least
    assert not eos & set(out.token_ids[:at_least])
    # Until EOS was due, the reply is the plain one.
    assert out.token_ids[: len(greedy_reply.token_ids) - 1] == greedy_reply.token_ids[:-1]


def test_bad_words_never_appear(make_engine, chat_prompts, greedy_reply):
    word = "classic"
    assert f" {word}" in greedy_reply.text
    params = SamplingParams(**GREEDY, bad_words=[word])
    out = make_engine().generate([chat_prompts[0]], params)[0]
    assert word not in out.text
    assert out.text != greedy_reply.text


def test_logit_bias_steers_greedy_and_ids_are_checked(make_engine, chat_prompts, greedy_reply):
    engine = make_engine()
    first = greedy_reply.token_ids[0]
    params = SamplingParams(max_tokens=2, temperature=0.0, logit_bias={first: -100})
    assert engine.generate([chat_prompts[0]], params)[0].token_ids[0] != first
    with pytest.raises(InvalidSamplingParams) as error:
        engine.add_request("bad", chat_prompts[0], SamplingParams(logit_bias={10**6: 1.0}))
    assert error.value.param == "logit_bias"
    assert not engine.has_unfinished_requests()


def test_include_stop_str_and_special_tokens(make_engine, chat_prompts, tokenizer, greedy_reply):
    engine = make_engine()
    kept = SamplingParams(**GREEDY, stop=["math"], include_stop_str_in_output=True)
    assert engine.generate([chat_prompts[0]], kept)[0].text.endswith("math")
    special = SamplingParams(**GREEDY, skip_special_tokens=False, include_stop_str_in_output=True)
    out = engine.generate([chat_prompts[0]], special)[0]
    assert out.text.endswith(tokenizer.convert_ids_to_tokens(greedy_reply.token_ids[-1]))


def test_seeded_choices_are_reproducible_alone_or_in_a_batch(make_engine, chat_prompts):
    """n=3 with a seed: three different choices, the same three whether the
    request runs alone or among others. The draw is batch-invariant given
    the logits; deterministic mode makes the logits so too (float32 matmul
    bits change with the number of rows on some CPUs, and the second run
    hits the prefix cache)."""
    params = SamplingParams(
        max_tokens=12, temperature=1.0, top_p=0.9, seed=77, n=3, deterministic=True
    )
    engine = make_engine()
    alone = engine.generate([chat_prompts[1]], params)[0]
    others = SamplingParams(max_tokens=12, temperature=1.0)
    mixed = engine.generate(
        [chat_prompts[5], chat_prompts[1], chat_prompts[3]], [others, params, others]
    )[1]
    assert [c.token_ids for c in alone.choices] == [c.token_ids for c in mixed.choices]
    assert len({tuple(c.token_ids) for c in alone.choices}) == 3
