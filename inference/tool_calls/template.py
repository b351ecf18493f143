"""Chat messages with tools, tool calls and tool results -> prompt token ids.

The template is chosen per model: its own when it renders tools (it
mentions ``tools``, as Qwen2.5's and Hermes' do); for a ChatML template
without tools (SmolLM2's) ``chatml_tools.jinja``, ours, in the hermes
format the extractor reads; any other model refuses tools with a 400. A
request without tools, tool calls or tool results renders with the model's
template exactly as before.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import cache
from pathlib import Path
from typing import Any

from inference.errors import InvalidRequest
from inference.request import ChatTurn
from tokenization import apply_chat_template

# OpenAI's newer name for "system"; templates know only the older one.
_TEMPLATE_ROLES = {"developer": "system"}


@cache
def chatml_tools_template() -> str:
    return (Path(__file__).with_name("chatml_tools.jinja")).read_text()


def template_messages(turns: Sequence[ChatTurn]) -> list[dict[str, Any]]:
    """Chat turns as the dicts chat templates take (Hugging Face's shape: the
    JSON a template reads)."""
    out = []
    for turn in turns:
        item: dict[str, Any] = {
            "role": _TEMPLATE_ROLES.get(turn.role, turn.role),
            "content": turn.text,
        }
        if turn.tool_calls:
            item["tool_calls"] = [
                {
                    "id": call.id,
                    "type": "function",
                    "function": {"name": call.name, "arguments": call.arguments},
                }
                for call in turn.tool_calls
            ]
        if turn.tool_call_id is not None:
            item["tool_call_id"] = turn.tool_call_id
        out.append(item)
    return out


def uses_tools(messages: list[dict[str, Any]], tools: list | None) -> bool:
    return bool(tools) or any(m["role"] == "tool" or m.get("tool_calls") for m in messages)


def tools_template(tokenizer, model: str) -> str | None:
    """The template for a request with tools: None for the model's own."""
    own = tokenizer.chat_template if isinstance(tokenizer.chat_template, str) else ""
    if "tools" in own:
        return None
    if "<|im_start|>" in own:
        return chatml_tools_template()
    raise InvalidRequest(
        f"The model '{model}' has no chat template for tools, tool calls or tool results.",
        param="tools",
        code="unsupported_value",
    )


def prompt_render(
    tokenizer, messages: list[dict[str, Any]], *, tools: list | None, model: str
) -> list[int]:
    """Prompt token ids of ``messages`` (and ``tools``), ending with the assistant's turn."""
    if not uses_tools(messages, tools):
        return apply_chat_template(tokenizer, messages)
    template = tools_template(tokenizer, model)
    return apply_chat_template(tokenizer, messages, tools=tools, chat_template=template)
