"""Tool calling through /v1/chat/completions: errors, and the openai SDK
reading tool calls whole and streamed (scripted text, then the real model)."""

from __future__ import annotations

import json

import pytest
from asgiref.sync import sync_to_async

from billing.models import UsageRecord
from config import embedded as embedded_setup
from gpuworkers import embedded
from inference.relay.tap import drain_background
from tests.plugins.asgi_client import sdk_client
from tests.plugins.request_path import DEMO, auth
from wire.bus import reset_buses

CHAT = "/v1/chat/completions"
HI = [{"role": "user", "content": "What is the weather in Paris?"}]
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The current weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}
# The same tool with a bounded argument, for the real model: constrained
# decoding guarantees the shape, but an unbounded string may run to max_tokens.
BOUNDED_WEATHER = {
    "type": "function",
    "function": {
        **WEATHER["function"],
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "enum": ["Paris", "London", "Tokyo"]}},
            "required": ["city"],
            "additionalProperties": False,
        },
    },
}
# What the model writes, in the pieces the worker streams it in.
PIECES = [
    "Checking.\n<tool",
    '_call>\n{"name": "get_weather", "argu',
    'ments": {"city": "Pa',
    'ris"}}\n</tool_call>\n<tool_call>{"name": "get_weather", ',
    '"arguments": {"city": "Oslo"}}</tool_call>',
]


def post(client, key, **fields):
    body = json.dumps({"model": DEMO, "messages": HI, **fields})
    return client.post(CHAT, body, content_type="application/json", **auth(key))


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    "fields, param",
    [
        ({"tool_choice": "auto"}, "tool_choice"),
        ({"parallel_tool_calls": False}, "parallel_tool_calls"),
        (
            {"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}},
            "tool_choice",
        ),
        ({"tools": [WEATHER], "tool_choice": "sometimes"}, "tool_choice"),
        ({"tools": [WEATHER, WEATHER]}, "tools[1].function.name"),
        (
            {
                "tools": [
                    {
                        "type": "function",
                        "function": {"name": "f", "parameters": {"type": "objekt"}},
                    }
                ]
            },
            "tools[0].function.parameters",
        ),
        (
            {
                "tools": [
                    {
                        "type": "function",
                        "function": {"name": "f", "parameters": {"type": "string"}},
                    }
                ]
            },
            "tools[0].function.parameters",
        ),
        (
            {"tools": [{"type": "function", "function": {"name": "bad name"}}]},
            "tools[0].function.name",
        ),
        (
            {"messages": [{"role": "assistant", "content": None}]},
            "messages[0].content",
        ),
        (
            {"messages": [{"role": "user", "content": "x", "tool_call_id": "c"}]},
            "messages[0].tool_call_id",
        ),
    ],
)
def test_bad_tool_parameters_are_400_naming_them(client, pro_key, fake_worker, fields, param):
    worker = fake_worker()
    response = post(client, pro_key, **fields)
    assert response.status_code == 400, response.content
    error = json.loads(response.content)["error"]
    assert (error["type"], error["param"]) == ("invalid_request_error", param)
    assert error["message"]
    assert worker.received == []


@pytest.fixture
def canned(fake_worker):
    """Streams PIECES as one choice's text, one token each, then stops."""
    return fake_worker(texts=list(PIECES), worker_id="canned-worker")


@pytest.mark.asyncio
@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("close_db_threads")
async def test_sdk_reads_whole_and_streamed_tool_calls_alike(canned, pro_key):
    client = sdk_client(pro_key)
    whole = await client.chat.completions.create(model=DEMO, messages=HI, tools=[WEATHER])
    choice = whole.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content == "Checking."
    calls = choice.message.tool_calls
    assert [(c.type, c.function.name, json.loads(c.function.arguments)) for c in calls] == [
        ("function", "get_weather", {"city": "Paris"}),
        ("function", "get_weather", {"city": "Oslo"}),
    ]
    assert len({c.id for c in calls}) == 2 and all(c.id.startswith("call_") for c in calls)

    stream = await client.chat.completions.create(
        model=DEMO, messages=HI, tools=[WEATHER], stream=True
    )
    content, acc, reasons = "", {}, []
    async for chunk in stream:
        if not chunk.choices:
            continue
        delta = chunk.choices[0].delta
        content += delta.content or ""
        for part in delta.tool_calls or ():
            slot = acc.setdefault(part.index, {"id": None, "name": "", "arguments": ""})
            slot["id"] = part.id or slot["id"]
            if part.function is not None:
                slot["name"] += part.function.name or ""
                slot["arguments"] += part.function.arguments or ""
        if chunk.choices[0].finish_reason:
            reasons.append(chunk.choices[0].finish_reason)
    assert content == "Checking." and reasons == ["tool_calls"]
    assert [(v["name"], json.loads(v["arguments"])) for _, v in sorted(acc.items())] == [
        ("get_weather", {"city": "Paris"}),
        ("get_weather", {"city": "Oslo"}),
    ]
    # Usage and billing see the engine's tokens, whatever the formatting.
    await drain_background()
    record = await sync_to_async(UsageRecord.objects.get)(response_id=whole.id)
    assert (record.completion_tokens, record.finish_reason) == (len(PIECES), "stop")


# The real demo model on the embedded engine (slow: loads and warms it).


@pytest.fixture
def real_engine(settings, demo_model):
    settings.REDIS_URL = None
    settings.EMBEDDED_ENGINE = True
    settings.ENGINE_KV_CACHE_MB = 32
    reset_buses()
    # Requests are refused (model_warming_up) until the engine is ready.
    assert embedded_setup.start().wait_ready(600)
    yield
    embedded.stop()
    reset_buses()


def accumulate(chunks) -> tuple[str, dict[int, dict], list[str]]:
    content, calls, reasons = "", {}, []
    for chunk in chunks:
        for choice in chunk.choices:
            content += choice.delta.content or ""
            for part in choice.delta.tool_calls or ():
                slot = calls.setdefault(part.index, {"id": part.id, "name": "", "arguments": ""})
                if part.function is not None:
                    slot["name"] += part.function.name or ""
                    slot["arguments"] += part.function.arguments or ""
            if choice.finish_reason:
                reasons.append(choice.finish_reason)
    return content, calls, reasons


@pytest.mark.slow
@pytest.mark.asyncio
@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("close_db_threads")
async def test_real_model_auto_and_none_answer_in_openais_shape(real_engine, pro_key):
    """Whether the 135M model calls the tool is its choice; the shapes are ours:
    streamed and whole agree (greedy, deterministic), calls name a declared
    tool, a reply with calls finishes with tool_calls, one without is text."""
    client = sdk_client(pro_key)
    common = dict(model=DEMO, messages=HI, tools=[WEATHER], max_tokens=48, temperature=0)
    common["extra_body"] = {"deterministic": True}
    whole = await client.chat.completions.create(**common)
    chunks = [c async for c in await client.chat.completions.create(**common, stream=True)]
    content, calls, reasons = accumulate(chunks)
    message = whole.choices[0].message
    assert [(c.function.name, c.function.arguments) for c in message.tool_calls or ()] == [
        (v["name"], v["arguments"]) for _, v in sorted(calls.items())
    ]
    assert (message.content or "") == content and reasons == [whole.choices[0].finish_reason]
    if message.tool_calls:
        assert whole.choices[0].finish_reason == "tool_calls"
        assert {c.function.name for c in message.tool_calls} == {"get_weather"}
    else:
        assert whole.choices[0].finish_reason in ("stop", "length") and message.content
    plain = await client.chat.completions.create(**common, tool_choice="none")
    assert plain.choices[0].message.tool_calls is None
    assert plain.choices[0].finish_reason in ("stop", "length")


@pytest.mark.slow
@pytest.mark.asyncio
@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("close_db_threads")
async def test_real_model_required_and_named_always_call(real_engine, pro_key):
    """Constrained decoding makes the call certain: required without parallel
    calls and a named function each yield that one tool, with JSON object
    arguments. (Required with parallel calls lets the model add calls until
    max_tokens; its schema is checked in test_setup.)"""
    client = sdk_client(pro_key)
    common = dict(model=DEMO, messages=HI, tools=[BOUNDED_WEATHER], max_tokens=64, temperature=0)
    named = {"type": "function", "function": {"name": "get_weather"}}
    cases = [("required", False), (named, True)]
    for choice, parallel in cases:
        options = dict(common, tool_choice=choice, parallel_tool_calls=parallel)
        whole = await client.chat.completions.create(**options)
        message = whole.choices[0].message
        assert whole.choices[0].finish_reason == "tool_calls" and message.content is None
        assert [c.function.name for c in message.tool_calls] == ["get_weather"]
        assert all(isinstance(json.loads(c.function.arguments), dict) for c in message.tool_calls)
        chunks = [c async for c in await client.chat.completions.create(**options, stream=True)]
        _, calls, reasons = accumulate(chunks)
        assert reasons == ["tool_calls"]
        assert [(v["name"], v["arguments"]) for _, v in sorted(calls.items())] == [
            (c.function.name, c.function.arguments) for c in message.tool_calls
        ]
