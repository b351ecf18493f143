"""/v1/completions and vLLM's extras through the official SDK, on the real engine.

The web tier and a real ``WorkerLoop`` share this process and the
in-process bus (as in embedded mode). Greedy runs that are compared set
``deterministic`` so batching and caching cannot change their tokens.
"""

# Fixtures come from other packages' conftests, imported by name.
# ruff: noqa: F401, F811

from __future__ import annotations

import uuid

import openai
import pytest
from asgiref.sync import sync_to_async

from billing.models import UsageRecord
from inference.relay import tap as relay
from tests.plugins.request_path import DEMO, pro_client

pytestmark = [
    pytest.mark.asyncio,
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("close_db_threads"),
]

GREEDY = {"temperature": 0, "extra_body": {"deterministic": True}}


def prompt() -> str:
    return f"The ocean is ({uuid.uuid4().hex[:6]})"


async def records(*response_ids: str) -> list[UsageRecord]:
    await relay.drain_background()
    return await sync_to_async(list)(
        UsageRecord.objects.filter(response_id__in=response_ids).order_by("prompt_tokens")
    )


async def test_completion_with_logprobs_streamed_and_not(demo_worker, api_key_factory, demo_model):
    """Legacy logprobs line up with the text; the stream joins to the same text."""
    client = await pro_client(api_key_factory)
    text = prompt()
    whole = await client.completions.create(
        model=DEMO, prompt=text, max_tokens=6, logprobs=2, **GREEDY
    )
    choice = whole.choices[0]
    assert whole.object == "text_completion" and whole.id.startswith("cmpl-")
    lp = choice.logprobs
    assert "".join(lp.tokens) == choice.text and len(lp.tokens) == whole.usage.completion_tokens
    assert lp.text_offset == [sum(len(t) for t in lp.tokens[:i]) for i in range(len(lp.tokens))]
    for token, logprob, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs, strict=True):
        assert top[token] == logprob and len(top) <= 3 and max(top.values()) <= 0
    (record,) = await records(whole.id)
    assert record.completion_tokens == whole.usage.completion_tokens == 6
    assert record.prompt_tokens == whole.usage.prompt_tokens > 0

    stream = await client.completions.create(
        model=DEMO, prompt=text, max_tokens=6, stream=True, **GREEDY
    )
    chunks = [c async for c in stream]
    assert "".join(c.choices[0].text for c in chunks if c.choices) == choice.text
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"


async def test_echo_prepends_the_prompt_and_scores_it(demo_worker, api_key_factory, demo_model):
    client = await pro_client(api_key_factory)
    text = prompt()
    out = await client.completions.create(
        model=DEMO, prompt=text, max_tokens=3, echo=True, logprobs=1, **GREEDY
    )
    choice, usage = out.choices[0], out.usage
    assert choice.text.startswith(text) and len(choice.text) > len(text)
    lp = choice.logprobs
    assert len(lp.tokens) == usage.prompt_tokens + usage.completion_tokens
    # The first prompt token has no logprob (nothing predicts it), as with OpenAI.
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    assert all(v is not None and v <= 0 for v in lp.token_logprobs[1:])
    assert "".join(lp.tokens[: usage.prompt_tokens]) == text
    assert lp.text_offset[usage.prompt_tokens] == len(text)

    streamed = await client.completions.create(
        model=DEMO, prompt=text, max_tokens=3, echo=True, stream=True, **GREEDY
    )
    assert "".join([c.choices[0].text async for c in streamed if c.choices]) == choice.text


async def test_a_list_of_token_id_prompts_is_one_choice_each(
    demo_worker, api_key_factory, demo_model
):
    """Two prompts, n=2: four choices numbered prompt * n + j, one usage record per prompt."""
    client = await pro_client(api_key_factory)
    tokenizer = demo_worker.engine.tokenizer
    prompts = [tokenizer.encode(prompt()), tokenizer.encode(prompt() + " and the sky")]
    out = await client.completions.create(
        model=DEMO, prompt=prompts, max_tokens=2, n=2, temperature=0.8, seed=7
    )
    assert [c.index for c in out.choices] == [0, 1, 2, 3]
    assert all(c.finish_reason == "length" for c in out.choices)
    assert out.usage.prompt_tokens == len(prompts[0]) + len(prompts[1])
    assert out.usage.completion_tokens == 8
    rows = await sync_to_async(list)(
        UsageRecord.objects.filter(prompt_tokens__in=[len(p) for p in prompts]).filter(
            response_id__startswith="cmpl-", completion_tokens=4
        )
    )
    assert sorted(r.prompt_tokens for r in rows)[-2:] == sorted(len(p) for p in prompts)


async def test_bad_completion_requests_are_400s_naming_the_param(api_key_factory, demo_model):
    client = await pro_client(api_key_factory)
    cases = [
        ({"prompt": "x", "suffix": "y"}, "suffix"),
        ({"prompt": "x", "extra_body": {"best_of": 2}}, "best_of"),
        ({"prompt": "x", "logit_bias": {"a": 1}}, "logit_bias"),
        ({"prompt": [10**6]}, "prompt"),
        ({"prompt": ""}, "prompt"),
        ({"prompt": "x", "logprobs": 21}, "logprobs"),
    ]
    for kwargs, param in cases:
        with pytest.raises(openai.BadRequestError) as caught:
            await client.completions.create(model=DEMO, **kwargs)
        assert caught.value.param == param, kwargs
    assert await sync_to_async(UsageRecord.objects.count)() == 0


async def test_vllm_extras_through_extra_body(demo_worker, api_key_factory, demo_model):
    """top_k=1 and min_p=1 are greedy but for ties; stop_token_ids and include_stop_str_in_output
    end where asked; ignore_eos with max_completion_tokens runs the full length."""
    client = await pro_client(api_key_factory)
    messages = [{"role": "user", "content": f"Count to ten ({uuid.uuid4().hex[:6]})."}]

    async def chat(**kwargs):
        body = {"deterministic": True, **kwargs.pop("extra_body", {})}
        return await client.chat.completions.create(
            model=DEMO, messages=messages, max_completion_tokens=8, extra_body=body, **kwargs
        )

    greedy_reply = await chat(temperature=0, logprobs=True, top_logprobs=3)
    greedy = greedy_reply.choices[0].message.content
    # top_k=1 and min_p=1 keep every token tied for the top probability (the
    # sampler's cuts keep ties, and bfloat16 logits do tie): the greedy
    # tokens up to the first tie, and there one of the tied tokens.
    for extra in ({"top_k": 1}, {"min_p": 1.0}):
        reply = await chat(temperature=1, logprobs=True, extra_body=extra)
        # Past a tie the two replies may differ in length too.
        steps = zip(
            greedy_reply.choices[0].logprobs.content,
            reply.choices[0].logprobs.content,
            strict=False,
        )
        for step, got in steps:
            tied = {t.token for t in step.top_logprobs if t.logprob == step.logprob}
            # More tokens may tie than top_logprobs lists (CI once saw four at
            # one step), so the sampled token is checked by its logprob: it
            # must be one of the most probable.
            assert step.token in tied and got.logprob == step.logprob, (extra, step, got)
            if len(tied) > 1:
                break
    seeded = [(await chat(temperature=1.0, seed=3)).choices[0].message.content for _ in range(2)]
    assert seeded[0] == seeded[1]
    token_ids = demo_worker.engine.tokenizer.encode(greedy)
    stop_id = token_ids[2]
    cut = await chat(temperature=0, extra_body={"stop_token_ids": [stop_id]})
    assert cut.choices[0].finish_reason == "stop" and cut.usage.completion_tokens <= 3
    word = greedy.strip().split()[0]
    kept = await chat(temperature=0, stop=[word], extra_body={"include_stop_str_in_output": True})
    assert kept.choices[0].message.content.endswith(word)
    full = await chat(temperature=0, extra_body={"ignore_eos": True, "repetition_penalty": 1.2})
    assert full.usage.completion_tokens == 8
    with pytest.raises(openai.BadRequestError) as caught:
        await chat(extra_body={"no_such_param": 1})
    assert caught.value.param == "no_such_param"
