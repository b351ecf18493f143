"""The OpenAI-SDK flow both e2e topologies must pass."""

from __future__ import annotations

from collections.abc import Callable

import openai
import pytest
from openai import OpenAI

MODEL = "smollm2-135m-instruct"
MESSAGES = [{"role": "user", "content": "Name three colors."}]
MAX_TOKENS = 8


def client_for(base_url: str, key: str) -> OpenAI:
    return OpenAI(base_url=base_url, api_key=key, max_retries=0, timeout=120)


def collect_stream(client: OpenAI, **kwargs) -> list:
    stream = client.chat.completions.create(
        model=MODEL,
        messages=MESSAGES,
        stream=True,
        stream_options={"include_usage": True},
        **kwargs,
    )
    return list(stream)


def assert_finish_once_per_choice_on_its_last_chunk(chunks: list, n: int) -> dict[int, str]:
    """Every choice's finish_reason appears once, on the last chunk naming it."""
    positions: dict[int, list[int]] = {i: [] for i in range(n)}
    finishes: dict[int, list[str]] = {i: [] for i in range(n)}
    for pos, chunk in enumerate(chunks):
        for choice in chunk.choices:
            positions[choice.index].append(pos)
            if choice.finish_reason is not None:
                finishes[choice.index].append(choice.finish_reason)
                assert pos == positions[choice.index][-1]
    for index in range(n):
        assert len(finishes[index]) == 1, finishes
        last = positions[index][-1]
        assert any(c.index == index and c.finish_reason for c in chunks[last].choices)
    return {i: f[0] for i, f in finishes.items()}


def joined(chunks: list, index: int = 0) -> str:
    return "".join(
        c.delta.content or "" for chunk in chunks for c in chunk.choices if c.index == index
    )


def run_openai_flow(base_url: str, key: str, usage_row: Callable[[str], dict]) -> None:
    """Streamed == non-streamed, usage chunk == UsageRecord, n=2, typed errors."""
    client = client_for(base_url, key)
    for sampling in ({"temperature": 0}, {"temperature": 0.9, "seed": 1234}):
        full = client.chat.completions.create(
            model=MODEL, messages=MESSAGES, max_tokens=MAX_TOKENS, **sampling
        )
        assert full.object == "chat.completion" and len(full.choices) == 1
        assert full.choices[0].message.role == "assistant"
        chunks = collect_stream(client, max_tokens=MAX_TOKENS, **sampling)
        assert chunks[0].choices[0].delta.role == "assistant"
        assert joined(chunks) == full.choices[0].message.content, sampling
        reasons = assert_finish_once_per_choice_on_its_last_chunk(chunks, 1)
        assert reasons[0] == full.choices[0].finish_reason
        usage_chunk = chunks[-1]
        assert usage_chunk.choices == [] and usage_chunk.usage is not None
        row = usage_row(usage_chunk.id)
        assert row == {
            "prompt_tokens": usage_chunk.usage.prompt_tokens,
            "completion_tokens": usage_chunk.usage.completion_tokens,
            "cached_tokens": usage_chunk.usage.prompt_tokens_details.cached_tokens,
            "status": "completed",
        }
        assert usage_row(full.id)["completion_tokens"] == full.usage.completion_tokens

    n2 = {
        "max_tokens": 4,
        "n": 2,
        "temperature": 0.9,
        "seed": 7,
        "logprobs": True,
        "top_logprobs": 2,
    }
    both = client.chat.completions.create(model=MODEL, messages=MESSAGES, **n2)
    assert [c.index for c in both.choices] == [0, 1]
    assert both.usage.completion_tokens == usage_row(both.id)["completion_tokens"]
    # One logprob entry per generated token, each with the two runners-up.
    entries = [e for c in both.choices for e in c.logprobs.content]
    assert len(entries) == both.usage.completion_tokens
    assert all(len(e.top_logprobs) == 2 for e in entries)
    chunks = collect_stream(client, **n2)
    assert_finish_once_per_choice_on_its_last_chunk(chunks, 2)
    assert [joined(chunks, i) for i in (0, 1)] == [c.message.content for c in both.choices]
    streamed = [e for ch in chunks for c in ch.choices if c.logprobs for e in c.logprobs.content]
    assert len(streamed) == chunks[-1].usage.completion_tokens

    with pytest.raises(openai.BadRequestError) as bad:
        client.chat.completions.create(model=MODEL, messages=MESSAGES, n=9)
    assert bad.value.param == "n" and bad.value.code == "value_above_max_value"
    with pytest.raises(openai.BadRequestError) as bad:
        client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=10**7
        )
    assert bad.value.param == "max_tokens"
    with pytest.raises(openai.AuthenticationError):
        client_for(base_url, "sk-lp-nope.nope").chat.completions.create(
            model=MODEL, messages=MESSAGES
        )
    with pytest.raises(openai.NotFoundError) as missing:
        client.chat.completions.create(model="no-such-model", messages=MESSAGES)
    assert missing.value.code == "model_not_found"
    assert [m.id for m in client.models.list()] == [MODEL]
