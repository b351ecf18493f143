"""/v1/responses through the official SDK (create and stream), on the real engine."""

# Fixtures come from other packages' conftests, imported by name.
# ruff: noqa: F401, F811

from __future__ import annotations

import json
import uuid

import openai
import pytest
from asgiref.sync import sync_to_async

from billing.models import UsageRecord
from inference.relay import tap as relay
from tests.plugins.asgi_client import asgi_post, sse_events
from tests.plugins.request_path import DEMO, pro_client

pytestmark = [
    pytest.mark.asyncio,
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("close_db_threads"),
]

STREAM_TYPES = [
    "response.created",
    "response.in_progress",
    "response.output_item.added",
    "response.content_part.added",
]
END_TYPES = [
    "response.output_text.done",
    "response.content_part.done",
    "response.output_item.done",
]


async def test_create_with_instructions_and_items(demo_worker, api_key_factory, demo_model):
    """store=true (OpenAI's default) is accepted; the cap makes it incomplete."""
    client = await pro_client(api_key_factory)
    response = await client.responses.create(
        model=DEMO,
        instructions="Answer with numbers only.",
        input=[
            {"role": "user", "content": [{"type": "input_text", "text": "Count to three."}]},
            {"role": "assistant", "content": "1, 2, 3"},
            {"role": "user", "content": f"Now count from 1 to 50 ({uuid.uuid4().hex[:6]})."},
        ],
        max_output_tokens=4,
        temperature=0,
        store=True,
    )
    assert response.id.startswith("resp-") and response.object == "response"
    assert response.status == "incomplete"
    assert response.incomplete_details.reason == "max_output_tokens"
    assert response.output_text and response.output[0].content[0].type == "output_text"
    assert response.usage.output_tokens == 4 and response.usage.input_tokens > 10
    await relay.drain_background()
    record = await sync_to_async(UsageRecord.objects.get)(response_id=response.id)
    assert (record.prompt_tokens, record.completion_tokens) == (response.usage.input_tokens, 4)


async def test_stream_events_parse_in_the_sdk(demo_worker, api_key_factory, demo_model):
    client = await pro_client(api_key_factory)
    async with client.responses.stream(
        model=DEMO, input=f"Say hello ({uuid.uuid4().hex[:6]}).", max_output_tokens=6
    ) as stream:
        events = [event async for event in stream]
        final = await stream.get_final_response()
    types = [e.type for e in events]
    assert types[:4] == STREAM_TYPES and types[-4:-1] == END_TYPES
    assert types[-1] == "response.completed"
    assert [e.sequence_number for e in events] == list(range(len(events)))
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert deltas and final.output_text == deltas
    assert final.status in ("completed", "incomplete") and final.usage.output_tokens <= 6


async def test_stream_frames_name_their_event(demo_worker, api_key_factory, demo_model):
    """OpenAI's framing: event: <type> then data:, no [DONE]."""
    _, key = await sync_to_async(api_key_factory)(tier="pro")
    stream = asgi_post(
        "/v1/responses", key, {"model": DEMO, "input": "Hi", "max_output_tokens": 2, "stream": True}
    )
    body = (await stream.read_all()).decode()
    blocks = [b for b in body.split("\n\n") if b]
    for block in blocks:
        event_line, data_line = block.split("\n")
        assert event_line == f"event: {json.loads(data_line[6:])['type']}"
    assert "[DONE]" not in body and "id: " not in body


async def test_previous_response_id_and_unknown_params_are_400s(api_key_factory, demo_model):
    client = await pro_client(api_key_factory)
    with pytest.raises(openai.BadRequestError) as caught:
        await client.responses.create(model=DEMO, input="hi", previous_response_id="resp-1")
    assert caught.value.param == "previous_response_id"
    assert "stores no responses" in caught.value.message
    with pytest.raises(openai.BadRequestError) as caught:
        await client.responses.create(model=DEMO, input="hi", tools=[])
    assert caught.value.param == "tools"
