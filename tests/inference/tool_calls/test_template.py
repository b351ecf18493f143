"""Tools, tool calls and tool results through the demo model's chat template."""

import pytest

from fleet.selectors import served_model_dir
from inference.api.chat import chat_request
from inference.api.schemas import ChatCompletionRequest
from inference.errors import InvalidRequest
from inference.prompts.prepare import prompt_prepare
from inference.request import ChatPrompt
from tenants.models import Tenant
from tokenization.tokenizer import apply_chat_template, load_tokenizer

pytestmark = pytest.mark.django_db

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The weather in a city.",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    }
]
ROUND_TRIP = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Weather in Paris and Oslo?"},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
            },
            {
                "id": "call_2",
                "type": "function",
                "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'},
            },
        ],
    },
    {"role": "tool", "tool_call_id": "call_1", "content": "18C"},
    {"role": "tool", "tool_call_id": "call_2", "content": "3C"},
]


def chat_prompt_prepare(*, request, model, tier):
    """Prepare ``request`` (the chat schema) as the chat endpoint would."""
    internal = chat_request(request, tenant=Tenant(pk=1, tier=tier))
    assert isinstance(internal.prompt, ChatPrompt)
    return internal, prompt_prepare(request=internal, model=model, tier=tier)


def rendered(demo_model, tiers, **fields) -> str:
    request = ChatCompletionRequest(model="m", **fields)
    _, prepared = chat_prompt_prepare(request=request, model=demo_model, tier=tiers["pro"])
    return load_tokenizer(str(served_model_dir(model=demo_model))).decode(prepared.prompt_token_ids)


def test_tool_calls_and_results_round_trip_through_the_template(demo_model, tiers):
    text = rendered(demo_model, tiers, messages=ROUND_TRIP, tools=TOOLS)
    assert text.startswith("<|im_start|>system\nBe brief.\n\n# Tools\n")
    assert (
        '<tools>\n{"type": "function", "function": {"name": "get_weather", '
        '"description": "The weather in a city.", "parameters": {"type": "object", '
        '"properties": {"city": {"type": "string"}}}}}\n</tools>'
    ) in text
    assert text.endswith(
        "<|im_start|>user\nWeather in Paris and Oslo?<|im_end|>\n"
        "<|im_start|>assistant\n"
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>'
        "<|im_end|>\n"
        "<|im_start|>user\n<tool_response>\n18C\n</tool_response>\n"
        "<tool_response>\n3C\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n"
    )


def test_tool_choice_none_keeps_the_history_but_lists_no_tools(demo_model, tiers):
    text = rendered(demo_model, tiers, messages=ROUND_TRIP, tools=TOOLS, tool_choice="none")
    assert "<tools>" not in text and "<tool_response>\n18C" in text


def test_a_request_without_tools_renders_with_the_models_own_template(demo_model, tiers):
    messages = [{"role": "user", "content": "hi"}]
    request = ChatCompletionRequest(model="m", messages=messages)
    internal, prepared = chat_prompt_prepare(request=request, model=demo_model, tier=tiers["pro"])
    tokenizer = load_tokenizer(str(served_model_dir(model=demo_model)))
    assert prepared.prompt_token_ids == apply_chat_template(tokenizer, messages)
    assert internal.prompt.tool_parsing is None and prepared.sampling.structured_output is None


def test_a_forced_tool_call_cannot_also_take_a_response_format(demo_model, tiers):
    """Both constrain the whole reply: a 400 naming response_format, not a
    grammar that silently drops one of them."""
    messages = [{"role": "user", "content": "hi"}]
    request = ChatCompletionRequest(
        model="m",
        messages=messages,
        tools=TOOLS,
        tool_choice="required",
        response_format={"type": "json_object"},
    )
    with pytest.raises(InvalidRequest) as caught:
        chat_prompt_prepare(request=request, model=demo_model, tier=tiers["pro"])
    assert caught.value.param == "response_format"
    # Either alone is fine and constrains decoding.
    for alone in (
        ChatCompletionRequest(model="m", messages=messages, tools=TOOLS, tool_choice="required"),
        ChatCompletionRequest(
            model="m", messages=messages, response_format={"type": "json_object"}
        ),
    ):
        _, prepared = chat_prompt_prepare(request=alone, model=demo_model, tier=tiers["pro"])
        assert prepared.sampling.structured_output is not None
