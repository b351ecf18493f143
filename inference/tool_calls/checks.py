"""Rules over a whole request that one field's schema cannot state.

Called from ``ChatCompletionRequest``'s model validator; each rule raises
``InvalidRequest`` naming the exact param (``messages[2].tool_call_id``,
``tools[0].function.parameters``, ``tool_choice``), as OpenAI does. The
validator runs on the event loop, so it does only linear walks; compiling
the parameters schemas is ``tools_compile``'s, in a worker thread.
"""

from __future__ import annotations

import json
from typing import Any

from inference.errors import InvalidRequest
from inference.tool_calls.schema_guard import schema_compile, schema_shape_check


def _missing(param: str) -> InvalidRequest:
    return InvalidRequest(
        f"Missing required parameter: '{param}'.", param=param, code="missing_required_parameter"
    )


def _encodable(value: Any, param: str) -> None:
    # Unpaired surrogates are valid JSON but no text: the chat template
    # could not render them (schemas._encodable does this for plain fields).
    try:
        json.dumps(value, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidRequest(
            f"Invalid value for '{param}': it contains an unpaired surrogate (invalid Unicode).",
            param=param,
        ) from None


def messages_check(messages: list) -> None:
    """Tool calls only on assistant messages, tool results with their call's id."""
    for i, message in enumerate(messages):
        at = f"messages[{i}]"
        if message.tool_calls is not None and message.role != "assistant":
            raise InvalidRequest(
                f"Invalid parameter: '{at}.tool_calls' is only allowed on assistant messages.",
                param=f"{at}.tool_calls",
            )
        if message.role == "tool" and message.tool_call_id is None:
            raise _missing(f"{at}.tool_call_id")
        if message.tool_call_id is not None and message.role != "tool":
            raise InvalidRequest(
                f"Invalid parameter: '{at}.tool_call_id' is only allowed on tool messages.",
                param=f"{at}.tool_call_id",
            )
        if message.content is None and not (message.role == "assistant" and message.tool_calls):
            raise _missing(f"{at}.content")
        for j, call in enumerate(message.tool_calls or ()):
            _encodable(call.function.arguments, f"{at}.tool_calls[{j}].function.arguments")
            _encodable(call.id, f"{at}.tool_calls[{j}].id")


def tools_check(request: Any) -> None:
    """tool_choice against tools, unique names, and each parameters schema."""
    tools = request.tools
    if tools is None:
        for param in ("tool_choice", "parallel_tool_calls"):
            if getattr(request, param) is not None:
                raise InvalidRequest(
                    f"Invalid value for '{param}': '{param}' is only allowed when 'tools' "
                    "are specified.",
                    param=param,
                )
        return
    seen: set[str] = set()
    for i, tool in enumerate(tools):
        function = tool.function
        if function.name in seen:
            raise InvalidRequest(
                f"Invalid value for 'tools[{i}].function.name': a function named "
                f"'{function.name}' is already in 'tools'.",
                param=f"tools[{i}].function.name",
            )
        seen.add(function.name)
        _encodable(function.description, f"tools[{i}].function.description")
        if function.parameters is not None:
            parameters_check(function.parameters, f"tools[{i}].function.parameters", function.name)
    choice = request.tool_choice
    if choice is not None and not isinstance(choice, str) and choice.function.name not in seen:
        raise InvalidRequest(
            f"Invalid value for 'tool_choice': no function named '{choice.function.name}' "
            "is specified in 'tools'.",
            param="tool_choice",
        )


def parameters_check(schema: dict[str, Any], param: str, name: str) -> None:
    """A function's parameters: a JSON Schema describing an object, that asks
    for no retrieval and is within the size limits (cheap: no compile)."""
    _encodable(schema, param)
    if schema.get("type", "object") != "object":
        raise InvalidRequest(
            f"Invalid schema for function '{name}': the parameters must be a JSON Schema "
            f"of type 'object', got type {json.dumps(schema.get('type'))}.",
            param=param,
            code="invalid_function_parameters",
        )
    schema_shape_check(schema, param=param, what=f"function '{name}'")


def tools_compile(tools: list | None) -> None:
    """Compile each tool's parameters schema (``tools_check`` passed first).

    CPU work, milliseconds per schema: the API runs it in a worker thread
    (``inference.api.chat.chat_request``), never on the event loop.
    """
    for i, tool in enumerate(tools or ()):
        function = tool.function
        if function.parameters is not None:
            schema_compile(
                function.parameters,
                param=f"tools[{i}].function.parameters",
                what=f"function '{function.name}'",
            )
