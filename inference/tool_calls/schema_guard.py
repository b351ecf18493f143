"""What a client's JSON Schema may ask of the server: no I/O, bounded work.

A tool's ``parameters`` (and ``response_format``'s schema) is compiled by
jsonschema_rs and llguidance. Left to itself jsonschema_rs resolves a
``$ref`` (or an unknown ``$schema``) by fetching it over HTTP or reading a
``file://`` path, synchronously: an outbound request from the server, a
local-file oracle through the echoed error, and a stall of the caller. So
a schema is checked here first, by a walk over its JSON, before any
library sees it:

- every ``$ref`` / ``$dynamicRef`` / ``$recursiveRef`` points inside the
  document (``#`` or ``#/...`` or ``#anchor``): a fragment resolves against
  the resource it sits in, which is always part of the document, so no
  ``$id`` can make it a retrieval;
- ``$schema`` names one of the drafts the libraries ship, never a URL to
  fetch;
- at most MAX_SCHEMA_DEPTH nested objects and arrays, at most
  MAX_SCHEMA_CHARS characters of compact JSON.

The compile itself (``schema_compile``) still refuses retrieval
(``offline=True``, a registry without a retriever) as a second line, and
bounds each ``pattern``'s compiled size. Size and depth bound its time: a
schema at both limits compiles in milliseconds (tests/inference/tool_calls).
Callers run it off the event loop.
"""

from __future__ import annotations

import json
from typing import Any

import jsonschema_rs

from inference.errors import InvalidRequest

# The structured-output spec's own bound (sampling_rules.structured); a
# tool's parameters schema ends up inside one when tool_choice forces it.
MAX_SCHEMA_CHARS = 64 * 1024
# Nested JSON objects and arrays. A schema level is two (the schema and its
# "properties"), so about 16 levels of objects, above OpenAI's own 10.
MAX_SCHEMA_DEPTH = 32
REF_KEYWORDS = ("$ref", "$dynamicRef", "$recursiveRef")
# The meta-schemas jsonschema_rs ships (with and without the empty fragment).
KNOWN_DRAFTS = frozenset(
    f"{scheme}://json-schema.org/{path}{fragment}"
    for scheme in ("http", "https")
    for path in (
        "draft-04/schema",
        "draft-06/schema",
        "draft-07/schema",
        "draft/2019-09/schema",
        "draft/2020-12/schema",
    )
    for fragment in ("", "#")
)
# A pattern compiles into at most this much automaton (the default is
# 10 MiB per pattern; a schema holds many).
_PATTERN_OPTIONS = jsonschema_rs.FancyRegexOptions(size_limit=1 << 20, dfa_size_limit=1 << 20)
_NO_RETRIEVAL = jsonschema_rs.Registry([])


# OpenAI's code for a bad tool schema; response_format's is invalid_value.
FUNCTION_PARAMETERS_CODE = "invalid_function_parameters"


def _refuse(param: str, what: str, detail: str) -> InvalidRequest:
    code = FUNCTION_PARAMETERS_CODE if param.startswith("tools[") else "invalid_value"
    return InvalidRequest(f"Invalid schema for {what}: {detail}", param=param, code=code)


def schema_shape_check(schema: dict[str, Any], *, param: str, what: str) -> None:
    """Raise InvalidRequest (naming ``param``) for a schema that would make the
    server fetch something, or is deeper or larger than the limits.

    ``what`` names the schema in the message ("function 'get_weather'").
    Iterative: a deep document cannot exhaust the stack here.
    """
    stack: list[tuple[Any, int]] = [(schema, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > MAX_SCHEMA_DEPTH:
            raise _refuse(param, what, f"it nests deeper than {MAX_SCHEMA_DEPTH} levels.")
        if isinstance(node, dict):
            for key, value in node.items():
                if key in REF_KEYWORDS and isinstance(value, str) and not value.startswith("#"):
                    raise _refuse(
                        param,
                        what,
                        f"'{key}' must point inside the schema ('#/$defs/...'); "
                        f"{json.dumps(value[:200])} would be fetched, which is not allowed.",
                    )
                if key == "$schema" and isinstance(value, str) and value not in KNOWN_DRAFTS:
                    raise _refuse(
                        param,
                        what,
                        f"'$schema' must name a JSON Schema draft (draft-04 to 2020-12); "
                        f"{json.dumps(value[:200])} is not one.",
                    )
                if isinstance(value, dict | list):
                    stack.append((value, depth + 1))
        else:
            stack.extend((item, depth + 1) for item in node if isinstance(item, dict | list))
    size = len(json.dumps(schema, separators=(",", ":"), ensure_ascii=False))
    if size > MAX_SCHEMA_CHARS:
        raise _refuse(
            param, what, f"it is {size} characters of JSON; at most {MAX_SCHEMA_CHARS} are allowed."
        )


def schema_compile(schema: dict[str, Any], *, param: str, what: str) -> None:
    """Validate ``schema`` against its meta-schema and compile it, with no
    retrieval of any kind; CPU work (run it off the event loop).

    ``schema_shape_check`` must have passed. Raises InvalidRequest with the
    library's first line of error.
    """
    try:
        jsonschema_rs.meta.validate(schema, registry=_NO_RETRIEVAL)
        # Compiling also judges $refs and regex patterns the meta-schema cannot.
        jsonschema_rs.validator_for(schema, offline=True, pattern_options=_PATTERN_OPTIONS)
    except (jsonschema_rs.ValidationError, jsonschema_rs.ReferencingError, ValueError) as exc:
        detail = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise _refuse(param, what, detail) from None
