"""The prompt screen sees every text the model will see, and bounds it first.

Through the official SDK against the ASGI app and a scripted worker: what
the worker received is decoded to show what the model would have read.
"""

from __future__ import annotations

import json

import openai
import pytest
from asgiref.sync import sync_to_async

from fleet.models import ServedModel
from fleet.selectors import served_model_dir
from safety.selectors import policy_cache_forget
from safety.services import tenant_safety_policy_update
from tests.plugins.asgi_client import sdk_client
from tests.plugins.request_path import DEMO
from tokenization.tokenizer import load_tokenizer

pytestmark = [
    pytest.mark.asyncio,
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("close_db_threads", "demo_model"),
]

TOOL = {
    "type": "function",
    "function": {
        "name": "notify",
        "description": "Mail ops.lead@example.com when the job is done.",
        "parameters": {
            "type": "object",
            "properties": {"note": {"type": "string", "description": "Cc jane.roe@example.org"}},
        },
    },
}


@pytest.fixture(autouse=True)
def fresh_policies():
    policy_cache_forget()
    yield
    policy_cache_forget()


async def new_key(api_key_factory, **policy) -> str:
    def make():
        key, raw = api_key_factory(tier="pro")
        if policy:
            tenant_safety_policy_update(tenant=key.tenant, **policy)
        return raw

    return await sync_to_async(make)()


async def seen_by_model(request) -> str:
    model = await sync_to_async(ServedModel.objects.get)(name=DEMO)
    return load_tokenizer(str(served_model_dir(model=model))).decode(request.prompt_token_ids)


async def test_pii_in_tool_text_is_redacted_before_the_worker_sees_it(fake_worker, api_key_factory):
    worker = fake_worker(texts=["Done."])
    raw = await new_key(api_key_factory, pii_action="redact")
    arguments = json.dumps({"note": "sent to bob.smith@example.net"})
    messages = [
        {"role": "user", "content": "Notify them."},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "notify", "arguments": arguments},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "Delivered to bob.smith@example.net"},
    ]
    completion = await sdk_client(raw).chat.completions.create(
        model=DEMO, messages=messages, tools=[TOOL]
    )
    assert completion.choices[0].message.content == "Done."
    (request,) = worker.received
    seen = await seen_by_model(request)
    for address in ("ops.lead@example.com", "jane.roe@example.org", "bob.smith@example.net"):
        assert address not in seen
    assert seen.count("EMAIL_ADDRESS") == 4, seen
    assert "notify" in seen


async def test_a_deny_listed_word_in_a_tool_is_refused(fake_worker, api_key_factory):
    worker = fake_worker(texts=["Done."])
    raw = await new_key(api_key_factory, deny_terms="bluebird", deny_action="block")
    for tool in (
        {"type": "function", "function": {"name": "bluebird.lookup"}},
        {"type": "function", "function": {"name": "f", "description": "Ask Bluebird."}},
        {
            "type": "function",
            "function": {
                "name": "f",
                "parameters": {"type": "object", "properties": {"bluebird": {"type": "string"}}},
            },
        },
    ):
        with pytest.raises(openai.BadRequestError) as error:
            await sdk_client(raw).chat.completions.create(
                model=DEMO, messages=[{"role": "user", "content": "hi"}], tools=[tool]
            )
        assert error.value.code == "content_policy_violation", tool
    arguments = json.dumps({"q": "a bluebird"})
    with pytest.raises(openai.BadRequestError) as error:
        await sdk_client(raw).chat.completions.create(
            model=DEMO,
            messages=[
                {"role": "user", "content": "hi"},
                {
                    "role": "assistant",
                    "tool_calls": [
                        {
                            "id": "c",
                            "type": "function",
                            "function": {"name": "f", "arguments": arguments},
                        }
                    ],
                },
                {"role": "tool", "tool_call_id": "c", "content": "ok"},
            ],
        )
    assert error.value.code == "content_policy_violation"
    assert worker.received == []


async def test_pii_in_a_tool_name_blocks_under_redact(fake_worker, api_key_factory):
    """A name cannot be redacted (the reply's calls are matched against it)."""
    worker = fake_worker(texts=["Done."])
    raw = await new_key(api_key_factory, pii_action="redact")
    tool = {"type": "function", "function": {"name": "call.415-555-0132"}}
    with pytest.raises(openai.BadRequestError) as error:
        await sdk_client(raw).chat.completions.create(
            model=DEMO, messages=[{"role": "user", "content": "hi"}], tools=[tool]
        )
    assert error.value.code == "content_policy_violation"
    assert worker.received == []


async def test_a_text_over_the_screen_cap_is_a_400_before_screening(
    fake_worker, api_key_factory, settings
):
    settings.SAFETY_MAX_SCREEN_CHARS = 1000
    worker = fake_worker(texts=["Done."])
    raw = await new_key(api_key_factory)
    client = sdk_client(raw)
    with pytest.raises(openai.BadRequestError) as error:
        await client.chat.completions.create(
            model=DEMO, messages=[{"role": "user", "content": "%" * 1001}]
        )
    assert (error.value.param, error.value.code) == ("messages", "string_above_max_length")
    assert "1000" in error.value.message
    tool = {"type": "function", "function": {"name": "f", "description": "x " * 501}}
    with pytest.raises(openai.BadRequestError) as error:
        await client.chat.completions.create(
            model=DEMO, messages=[{"role": "user", "content": "hi"}], tools=[tool]
        )
    assert (error.value.param, error.value.code) == ("tools", "string_above_max_length")
    with pytest.raises(openai.BadRequestError) as error:
        await client.moderations.create(input=["fine", "%" * 1001])
    assert (error.value.param, error.value.code) == ("input", "string_above_max_length")
    assert worker.received == []
    # At the cap itself, screened and served.
    completion = await client.chat.completions.create(
        model=DEMO, messages=[{"role": "user", "content": "%" * 1000}]
    )
    assert completion.choices[0].message.content == "Done."


async def test_a_megabyte_of_percent_signs_is_refused_quickly(fake_worker, api_key_factory):
    """The issue's probe: 1 MB of '%' under the default cap is a 400."""
    fake_worker(texts=["Done."])
    raw = await new_key(api_key_factory)
    with pytest.raises(openai.BadRequestError) as error:
        await sdk_client(raw).moderations.create(input="%" * 1_000_000)
    assert error.value.code == "string_above_max_length"


async def test_the_screens_refusal_wins_over_the_tokenizers_error(fake_worker, api_key_factory):
    """The tokenizer runs beside the screen: a prompt both blocked and over
    the output cap is still answered content_policy_violation, and the
    cap's 400 comes only for a prompt the screen lets through."""
    worker = fake_worker(texts=["Done."])
    raw = await new_key(api_key_factory, deny_terms="bluebird", deny_action="block")
    too_many = {"model": DEMO, "max_tokens": 10**7}
    with pytest.raises(openai.BadRequestError) as error:
        await sdk_client(raw).chat.completions.create(
            messages=[{"role": "user", "content": "About the bluebird."}], **too_many
        )
    assert error.value.code == "content_policy_violation"
    with pytest.raises(openai.BadRequestError) as error:
        await sdk_client(raw).chat.completions.create(
            messages=[{"role": "user", "content": "About the robin."}], **too_many
        )
    assert error.value.code == "integer_above_max_value"
    assert worker.received == []
