"""A reply cut by the safety screen frees its KV on the real engine at once.

The web tier and a real ``WorkerLoop`` (the demo engine) share this
process and the in-process bus. A first request learns the model's greedy
reply; a second tenant, whose deny list names a word from the middle of
that reply, gets it cut with ``content_filter``, and the engine must hold
no request and no KV block for it afterwards. Both requests are
deterministic, so the second reply is the first one, bit for bit.

Two paths free it, and this checks the outcome of both: the guard's
``cancel_request``, and the worker finding the stream already ended when
it next publishes. With both disabled the test fails (checked by hand).
"""

# Fixtures come from other packages' conftests, imported by name.
# ruff: noqa: F401, F811

from __future__ import annotations

import re
import threading
import uuid

import pytest
from asgiref.sync import sync_to_async

from gpuworkers.worker import WorkerLoop
from safety.services import tenant_safety_policy_update
from tests.helpers import async_wait_until
from tests.plugins.asgi_client import sdk_client
from tests.plugins.request_path import DEMO
from tests.serving import serving_worker
from wire.bus import get_worker_bus

pytestmark = [
    pytest.mark.asyncio,
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("close_db_threads", "demo_model"),
]

PROMPT = "Describe the sea in two sentences."


@pytest.fixture
def worker(engine, memory_bus):
    with serving_worker(engine, DEMO, "cut") as loop:
        yield loop


async def ask(client, max_tokens: int = 48, **extra):
    return await client.chat.completions.create(
        model=DEMO,
        messages=[{"role": "user", "content": PROMPT}],
        max_tokens=max_tokens,
        temperature=0,
        extra_body={"deterministic": True, **extra},
    )


async def test_a_cut_reply_leaves_no_request_or_kv_block_on_the_engine(worker, api_key_factory):
    _, free_key = await sync_to_async(api_key_factory)(tier="pro")
    full = (await ask(sdk_client(free_key))).choices[0].message.content
    words = [w for w in re.findall(r"[A-Za-z]{4,}", full) if w.lower() not in PROMPT.lower()]
    assert len(words) >= 3, full
    banned = words[2]

    def denying_key():
        key, raw = api_key_factory(tier="pro")
        tenant_safety_policy_update(tenant=key.tenant, deny_terms=banned)
        return raw

    raw = await sync_to_async(denying_key)()
    # Left alone, this one would run for 1000 tokens (many seconds): only
    # the abort that follows the cut can make the engine idle soon after.
    cut = await ask(sdk_client(raw), max_tokens=1000, ignore_eos=True)
    choice = cut.choices[0]
    assert choice.finish_reason == "content_filter"
    # What was sent is the reply up to the banned word, never the word.
    assert full.startswith(choice.message.content)
    assert banned not in choice.message.content
    assert cut.usage.completion_tokens < len(worker.engine.tokenizer.encode(full))

    # The worker aborted it: nothing of it is left running or holding KV.
    def engine_idle():
        stats = worker.engine.stats()
        return stats["running"] == 0 and stats["waiting"] == 0 and stats["kv_blocks_used"] == 0

    await async_wait_until(engine_idle, timeout=3)
    assert not worker.engine.has_unfinished_requests()
