"""Request schemas of tool calling: tool definitions, tool_choice, tool calls.

Standalone (no import of ``inference.api.schemas``, which imports these):
OpenAI's shapes, validated strictly like the rest of the request. What a
single field cannot judge (a parameters schema, a tool_choice naming a
tool that is not there) is checked in ``inference.tool_calls.setup``.
"""

from typing import Annotated, Any, Literal

from ninja import Schema
from pydantic import ConfigDict, Field

# OpenAI's limits: at most 128 tools, names of letters, digits, _ and -
# (we also take dots, as vLLM does), at most 64 characters.
MAX_TOOLS = 128
NAME_PATTERN = r"^[A-Za-z0-9_.\-]{1,64}$"

ToolName = Annotated[str, Field(pattern=NAME_PATTERN)]


class _Strict(Schema):
    model_config = ConfigDict(extra="forbid", strict=True)


class FunctionDefinition(_Strict):
    name: ToolName
    description: Annotated[str, Field(max_length=8192)] | None = None
    # A JSON Schema for the arguments object; absent means "no arguments".
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class ToolDefinition(_Strict):
    type: Literal["function"]
    function: FunctionDefinition


class FunctionName(_Strict):
    name: ToolName


class NamedToolChoice(_Strict):
    type: Literal["function"]
    function: FunctionName


ToolChoice = Literal["none", "auto", "required"] | NamedToolChoice


class ToolCallFunction(_Strict):
    name: ToolName
    # The arguments as a JSON text, as the API returned them.
    arguments: Annotated[str, Field(max_length=1_000_000)]


class ToolCall(_Strict):
    """A tool call an assistant message carries back into the conversation."""

    id: Annotated[str, Field(min_length=1, max_length=256)]
    type: Literal["function"]
    function: ToolCallFunction
