"""What a request's tools and tool_choice mean for the prompt, the sampler
and the reading of the output.

=========== ====================== ============================ ===============
tool_choice tools in the prompt    sampling                     output read as
=========== ====================== ============================ ===============
(absent),   yes                    unconstrained                text with
"auto"                                                          ``<tool_call>``
                                                                blocks
"none"      no (tool history only) unconstrained                plain text
"required"  yes                    JSON array of {name,         that array
                                   arguments}, 1+ items
named       yes                    the function's parameters    that arguments
                                                                object
=========== ====================== ============================ ===============

Constrained decoding is the engine's ``structured_output`` sampling field
(``{"type": "json_schema", "schema": ..., "strict": true}``), as vLLM
does it: "required" becomes an ``anyOf`` over the tools, each with its name
fixed and its parameters schema, named the parameters schema itself.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from inference.errors import InvalidRequest

# How ToolCallExtractor reads a choice's text (see extractor.py).
TAGGED, LIST, ARGUMENTS = "tagged", "list", "arguments"
_EMPTY_PARAMETERS = {"type": "object", "properties": {}}


@dataclass(slots=True, frozen=True)
class ToolParsing:
    """How to read one response's output; kept on its route for resumes."""

    mode: str
    # The declared tools: a tagged call naming another is left as text.
    names: tuple[str, ...]
    # False: at most one call per choice (parallel_tool_calls=false).
    parallel: bool = True
    # ARGUMENTS mode: the function tool_choice named.
    name: str | None = None


@dataclass(slots=True)
class ToolSetup:
    # OpenAI-shaped tools for the chat template; None: none rendered.
    template_tools: list[dict[str, Any]] | None
    parsing: ToolParsing | None
    # The sampling's structured_output (a JSON document); None: unconstrained.
    structured_output: dict[str, Any] | None


def tool_setup(request: Any) -> ToolSetup:
    """The prompt, sampling and parsing consequences of ``request``'s tools.

    "required" and a named function constrain decoding to a JSON Schema
    (the engine's ``structured_output``).
    """
    if not request.tools:
        return ToolSetup(None, None, None)
    tools = [template_tool(tool) for tool in request.tools]
    names = tuple(tool.function.name for tool in request.tools)
    parallel = request.parallel_tool_calls is not False
    choice = request.tool_choice or "auto"
    if choice == "none":
        return ToolSetup(None, None, None)
    if choice == "auto":
        return ToolSetup(tools, ToolParsing(TAGGED, names, parallel), None)
    if choice == "required":
        schema = required_schema(request.tools, parallel=parallel)
        return ToolSetup(tools, ToolParsing(LIST, names, parallel), json_schema(schema))
    function = next(t.function for t in request.tools if t.function.name == choice.function.name)
    schema = function.parameters or _EMPTY_PARAMETERS
    parsing = ToolParsing(ARGUMENTS, names, parallel, name=function.name)
    return ToolSetup(tools, parsing, json_schema(schema))


def template_tool(tool: Any) -> dict[str, Any]:
    """A tool as the chat template sees it: OpenAI's shape without unset keys."""
    function = tool.function
    fields = {"name": function.name, "description": function.description}
    fields["parameters"] = function.parameters
    # The parameters dict as sent: a JSON null inside it is meaningful.
    return {"type": "function", "function": {k: v for k, v in fields.items() if v is not None}}


def json_schema(schema: dict[str, Any]) -> dict[str, Any]:
    return {"type": "json_schema", "schema": schema, "strict": True}


def required_schema(tools: list, *, parallel: bool) -> dict[str, Any]:
    """A JSON array of ``{"name": ..., "arguments": {...}}``, one item per call.

    Each tool's ``$defs`` (and draft-7 ``definitions``) move to the root,
    where its root-relative ``$ref``s still find them once nested.
    """
    defs: dict[str, dict[str, Any]] = {}
    variants = []
    for i, tool in enumerate(tools):
        parameters = dict(tool.function.parameters or _EMPTY_PARAMETERS)
        for key in ("$defs", "definitions"):
            for def_name, definition in (parameters.pop(key, None) or {}).items():
                known = defs.setdefault(key, {})
                if known.get(def_name, definition) != definition:
                    raise InvalidRequest(
                        f"Invalid value for 'tools[{i}].function.parameters': "
                        f"'{key}/{def_name}' differs from another tool's of the same "
                        "name; tool_choice 'required' needs them to agree.",
                        param=f"tools[{i}].function.parameters",
                    )
                known[def_name] = definition
        variants.append(
            {
                "type": "object",
                "properties": {
                    "name": {"type": "string", "enum": [tool.function.name]},
                    "arguments": parameters,
                },
                "required": ["name", "arguments"],
                "additionalProperties": False,
            }
        )
    schema: dict[str, Any] = {"type": "array", "minItems": 1, "items": {"anyOf": variants}}
    if not parallel:
        schema["maxItems"] = 1
    schema.update(defs)
    return schema
