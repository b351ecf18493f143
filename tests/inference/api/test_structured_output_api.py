"""response_format through the API, served by the real demo engine.

The web tier and a real ``WorkerLoop`` share this process and the
in-process bus (as in embedded mode); requests go through the official
OpenAI SDK, as in test_sampling_api.py.
"""

# Fixtures come from other packages' conftests, imported by name.
# ruff: noqa: F401, F811

from __future__ import annotations

import json
import threading
import uuid
from typing import Annotated, Literal

import jsonschema_rs
import openai
import pytest
from asgiref.sync import sync_to_async
from pydantic import BaseModel, Field

from billing.models import UsageRecord
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


class Pet(BaseModel):
    # Bounded strings, an enum, a bounded integer: the tiny model finishes.
    name: Annotated[str, Field(max_length=12)]
    species: Literal["cat", "dog", "bird"]
    legs: Annotated[int, Field(ge=0, le=8)]


CITY = {
    "type": "object",
    "properties": {
        "city": {"enum": ["Paris", "Rome", "Oslo"]},
        "population_millions": {"type": "integer", "minimum": 0, "maximum": 40},
    },
    "required": ["city", "population_millions"],
    "additionalProperties": False,
}


def ask(text: str) -> list[dict]:
    return [{"role": "user", "content": f"{text} ({uuid.uuid4().hex[:6]})"}]


async def test_parse_returns_the_pydantic_object(demo_worker, api_key_factory, demo_model):
    client = await pro_client(api_key_factory)
    for sampling in ({"temperature": 0}, {"temperature": 1.0, "seed": 3}):
        completion = await client.chat.completions.parse(
            model=DEMO,
            messages=ask("Describe a pet as JSON."),
            response_format=Pet,
            max_tokens=64,
            **sampling,
        )
        choice = completion.choices[0]
        assert choice.finish_reason == "stop"
        assert isinstance(choice.message.parsed, Pet)
        assert choice.message.parsed.species in ("cat", "dog", "bird")


async def test_json_schema_strict_streamed(demo_worker, api_key_factory, demo_model):
    client = await pro_client(api_key_factory)
    stream = await client.chat.completions.create(
        model=DEMO,
        messages=ask("Name a city as JSON."),
        response_format={
            "type": "json_schema",
            "json_schema": {"name": "city", "schema": CITY, "strict": True},
        },
        max_tokens=48,
        temperature=1.0,
        seed=5,
        n=2,
        stream=True,
    )
    texts, finishes = {0: "", 1: ""}, {}
    async for chunk in stream:
        for choice in chunk.choices:
            texts[choice.index] += choice.delta.content or ""
            if choice.finish_reason:
                finishes[choice.index] = choice.finish_reason
    assert finishes == {0: "stop", 1: "stop"}
    for text in texts.values():
        jsonschema_rs.validate(CITY, json.loads(text))


async def test_json_object_is_an_object(demo_worker, api_key_factory, demo_model):
    client = await pro_client(api_key_factory)
    completion = await client.chat.completions.create(
        model=DEMO,
        messages=ask("Reply with a JSON object with one key."),
        response_format={"type": "json_object"},
        max_tokens=64,
        temperature=0,
    )
    choice = completion.choices[0]
    # A free-form object may run to max_tokens; then the text is a prefix.
    if choice.finish_reason == "stop":
        assert isinstance(json.loads(choice.message.content), dict)
    else:
        assert choice.finish_reason == "length"
        assert choice.message.content.startswith("{")


@pytest.mark.parametrize(
    ("response_format", "param", "message"),
    [
        (
            {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "objec"}}},
            "response_format",
            "Invalid type: objec",
        ),
        (
            {
                "type": "json_schema",
                "json_schema": {
                    "name": "x",
                    "schema": {"type": "string", "format": "no-such-format"},
                    "strict": True,
                },
            },
            "response_format",
            "no-such-format",
        ),
        ({"type": "json_schema"}, "response_format", "json_schema is required"),
        ({"type": "yaml"}, "response_format.type", None),
        ({"type": "json_object", "schema": {}}, "response_format.schema", None),
        (
            {"type": "json_schema", "json_schema": {"name": "bad name!", "schema": {}}},
            "response_format.json_schema.name",
            None,
        ),
    ],
)
async def test_bad_response_format_is_a_400_naming_it(
    demo_worker, api_key_factory, demo_model, response_format, param, message
):
    client = await pro_client(api_key_factory)
    before = await sync_to_async(UsageRecord.objects.count)()
    with pytest.raises(openai.BadRequestError) as raised:
        await client.chat.completions.create(
            model=DEMO, messages=ask("Hi."), response_format=response_format, max_tokens=4
        )
    error = raised.value.body
    assert raised.value.status_code == 400 and error["param"] == param, error
    assert error["type"] == "invalid_request_error"
    if message:
        assert message in error["message"]
    # Refused before admission: nothing reached the worker or billing.
    assert await sync_to_async(UsageRecord.objects.count)() == before
    assert demo_worker.engine.stats()["kv_blocks_used"] == 0
