"""vLLM's sampling extras through the API, served by the real demo engine.

The web tier and a real ``WorkerLoop`` share this process and the
in-process bus (as in embedded mode); requests go through the official
OpenAI SDK, the extras in ``extra_body`` as clients send them.
"""

# Fixtures come from other packages' conftests, imported by name.
# ruff: noqa: F401, F811

from __future__ import annotations

import math
import threading
import uuid

import pytest
from asgiref.sync import sync_to_async

from gpuworkers.worker import WorkerLoop
from tests.plugins.asgi_client import sdk_client
from tests.plugins.request_path import DEMO, pro_client
from tests.serving import serving_worker
from wire.bus import get_worker_bus

pytestmark = [
    pytest.mark.asyncio,
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("close_db_threads"),
]


async def test_logit_bias_and_min_tokens_steer_the_reply(demo_worker, api_key_factory, demo_model):
    """A +100 bias makes one token the whole greedy reply; min_tokens with
    ignore_eos off still runs to max_tokens when EOS is pushed down."""
    client = await pro_client(api_key_factory)
    forced = demo_worker.engine.tokenizer.encode(" sea", add_special_tokens=False)[0]
    completion = await client.chat.completions.create(
        model=DEMO,
        messages=[{"role": "user", "content": "Say hi."}],
        max_tokens=5,
        temperature=0,
        logit_bias={str(forced): 100},
        extra_body={"min_tokens": 5},
    )
    assert completion.choices[0].message.content == " sea" * 5
    assert completion.choices[0].finish_reason == "length"
    assert completion.usage.completion_tokens == 5


async def test_prompt_logprobs_come_whole_with_the_response(
    demo_worker, api_key_factory, demo_model
):
    client = await pro_client(api_key_factory)
    raw = await client.chat.completions.with_raw_response.create(
        model=DEMO,
        messages=[{"role": "user", "content": f"Name a colour ({uuid.uuid4().hex[:6]})."}],
        max_tokens=2,
        temperature=0,
        extra_body={"prompt_logprobs": 2},
    )
    body = raw.http_response.json()
    entries = body["prompt_logprobs"]
    assert len(entries) == body["usage"]["prompt_tokens"]
    assert entries[0] is None
    # Every later prompt token is scored, even those a cache could serve:
    # a prompt_logprobs request computes its whole prompt.
    assert all(isinstance(entry, dict) for entry in entries[1:])
    for entry in entries[1:]:
        ranks = sorted(v["rank"] for v in entry.values() if v["rank"] is not None)
        assert ranks[:2] == [1, 2]
        assert all(v["logprob"] <= 0 and math.isfinite(v["logprob"]) for v in entry.values())
        best = min(entry.values(), key=lambda v: v["rank"] or 99)
        assert all(best["logprob"] >= v["logprob"] for v in entry.values())


async def test_a_token_id_outside_the_vocabulary_is_a_400(api_key_factory, demo_model):
    import openai

    client = await pro_client(api_key_factory)
    with pytest.raises(openai.BadRequestError) as caught:
        await client.chat.completions.create(
            model=DEMO,
            messages=[{"role": "user", "content": "hi"}],
            extra_body={"stop_token_ids": [10**6]},
        )
    assert caught.value.param == "stop_token_ids"
    assert "vocabulary has 49152 tokens" in caught.value.message
