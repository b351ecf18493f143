"""Every field of OpenAI's chat and completions request bodies is accepted.

Real clients send service_tier, metadata, store, prompt_cache_key,
safety_identifier, user and the legacy functions/function_call; each is
honoured or accepted and ignored (README, "API compatibility"). Only a
field OpenAI does not define is a 400 unknown_parameter. The lists come
from the openai SDK installed here, so a field the SDK adds fails this.
"""

from __future__ import annotations

import json
import typing

import pytest
from openai.types import completion_create_params
from openai.types.chat import completion_create_params as chat_params

from inference.api.chat import chat_request
from inference.api.completions import CompletionRequest
from inference.api.schemas import ChatCompletionRequest
from tests.plugins.request_path import DEMO, auth

pytestmark = pytest.mark.django_db(transaction=True)

HI = [{"role": "user", "content": "hi"}]


def sdk_fields(typed_dict) -> set[str]:
    names = set(typing.get_type_hints(typed_dict))
    return names | {"stream"}


def schema_fields(schema) -> set[str]:
    return {info.alias or name for name, info in schema.model_fields.items()}


def test_every_sdk_chat_field_is_known():
    missing = sdk_fields(chat_params.CompletionCreateParamsBase) - schema_fields(
        ChatCompletionRequest
    )
    assert missing == set()


def test_every_sdk_completions_field_is_known():
    missing = sdk_fields(completion_create_params.CompletionCreateParamsBase) - schema_fields(
        CompletionRequest
    )
    assert missing == set()


# What a client of OpenAI's sends besides the basics, all in one body.
EXTRAS = {
    "service_tier": "auto",
    "metadata": {"session": "s-1", "team": "blue"},
    "store": False,
    "prompt_cache_key": "conversation-42",
    "prompt_cache_retention": "24h",
    "prompt_cache_options": {"mode": "implicit", "ttl": "30m"},
    "safety_identifier": "user-hash-1",
    "user": "end-user-7",
    "modalities": ["text"],
    "reasoning_effort": "low",
    "verbosity": "medium",
    "audio": {"voice": "alloy", "format": "mp3"},
    "prediction": {"type": "content", "content": "hello"},
    "web_search_options": {"search_context_size": "low"},
    "moderation": {"model": "omni-moderation-latest"},
    "max_completion_tokens": 2,
    "parallel_tool_calls": None,
}


def post(client, key, path="/v1/chat/completions", **fields):
    body = json.dumps({"model": DEMO, "messages": HI, **fields})
    return client.post(path, body, content_type="application/json", **auth(key))


def test_a_body_with_every_extra_field_is_served(client, pro_key, fake_worker):
    worker = fake_worker(tokens=2)
    response = post(client, pro_key, **EXTRAS)
    assert response.status_code == 200, response.content
    assert len(worker.received) == 1


def test_only_a_truly_unknown_field_is_400(client, pro_key, fake_worker):
    fake_worker(tokens=2)
    response = post(client, pro_key, **EXTRAS, service_tiers="auto")
    assert response.status_code == 400
    error = json.loads(response.content)["error"]
    assert (error["param"], error["code"]) == ("service_tiers", "unknown_parameter")


@pytest.mark.parametrize(
    "fields, param",
    [
        ({"modalities": ["text", "audio"]}, "modalities"),
        ({"service_tier": "turbo"}, "service_tier"),
        ({"metadata": {f"k{i}": "v" for i in range(17)}}, "metadata"),
        ({"metadata": {"k": "v" * 513}}, "metadata.k"),
        ({"function_call": "auto"}, "function_call"),
        (
            {"functions": [{"name": "f"}], "function_call": {"name": "g"}},
            "function_call",
        ),
        (
            {
                "functions": [{"name": "f"}],
                "tools": [{"type": "function", "function": {"name": "f"}}],
            },
            "functions",
        ),
    ],
)
def test_values_that_cannot_be_honoured_are_400_naming_the_field(client, pro_key, fields, param):
    response = post(client, pro_key, **fields)
    assert response.status_code == 400, response.content
    assert json.loads(response.content)["error"]["param"] == param


WEATHER = {
    "name": "get_weather",
    "description": "The weather in a city.",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
    },
}


def test_legacy_functions_become_tools(tenant_factory):
    """functions -> tools, function_call -> tool_choice, one call per reply."""
    tenant = tenant_factory(tier="pro")
    payload = ChatCompletionRequest.model_validate(
        {
            "model": DEMO,
            "messages": HI,
            "functions": [WEATHER],
            "function_call": {"name": "get_weather"},
            "prompt_cache_key": "conv-1",
            "safety_identifier": "sid",
        }
    )
    assert [t.function.name for t in payload.tools] == ["get_weather"]
    assert payload.tool_choice.function.name == "get_weather"
    assert payload.parallel_tool_calls is False
    internal = chat_request(payload, tenant=tenant)
    # Named function: decoding is constrained to its parameters schema.
    assert internal.sampling.structured_output["schema"] == WEATHER["parameters"]
    assert internal.prompt.tool_parsing.name == "get_weather"
    assert (internal.conversation_id, internal.user) == ("conv-1", "sid")


def test_a_legacy_function_conversation_is_replayed_as_tool_turns(tenant_factory):
    """An assistant function_call and its role "function" result pair up as a
    tool call and its tool result."""
    tenant = tenant_factory(tier="pro")
    payload = ChatCompletionRequest.model_validate(
        {
            "model": DEMO,
            "functions": [WEATHER],
            "messages": [
                {"role": "user", "content": "Weather in Paris?"},
                {
                    "role": "assistant",
                    "content": None,
                    "refusal": None,
                    "function_call": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                },
                {"role": "function", "name": "get_weather", "content": "sunny"},
            ],
        }
    )
    turns = chat_request(payload, tenant=tenant).prompt.turns
    call = turns[1].tool_calls[0]
    assert (call.name, call.arguments) == ("get_weather", '{"city": "Paris"}')
    assert (turns[2].role, turns[2].tool_call_id) == ("tool", call.id)


def test_the_header_conversation_wins_over_prompt_cache_key(tenant_factory):
    tenant = tenant_factory(tier="pro")
    payload = ChatCompletionRequest.model_validate(
        {"model": DEMO, "messages": HI, "prompt_cache_key": "body"}
    )
    assert chat_request(payload, tenant=tenant, conversation_id="header").conversation_id == (
        "header"
    )


def test_completions_take_best_of_equal_to_n(client, pro_key, fake_worker):
    fake_worker(tokens=2)
    body = json.dumps({"model": DEMO, "prompt": "x", "best_of": 2, "n": 2, "max_tokens": 2})
    ok = client.post("/v1/completions", body, content_type="application/json", **auth(pro_key))
    assert ok.status_code == 200, ok.content
    body = json.dumps({"model": DEMO, "prompt": "x", "best_of": 3, "n": 2})
    refused = client.post("/v1/completions", body, content_type="application/json", **auth(pro_key))
    assert json.loads(refused.content)["error"]["param"] == "best_of"
