"""Text the stores can hold: the rule every request edge applies.

PostgreSQL's text types cannot hold NUL (psycopg refuses the query with
DataError), and an unpaired UTF-16 surrogate, which a JSON escape such as
``"\\ud800"`` can spell, is no text at all: UTF-8 cannot encode it, so
neither psycopg, Redis nor the tokenizer can take it. A request carrying
either is refused at the edge (the API's schemas, the console socket's
frames) with an error naming the field, before any lookup or write.
"""

from __future__ import annotations

from typing import Any

NUL = "\x00"


def unstorable_reason(value: str) -> str | None:
    """Why ``value`` cannot be stored, or None when it can."""
    if NUL in value:
        return "it contains a NUL character (\\u0000)"
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return "it contains an unpaired surrogate (invalid Unicode)"
    return None


def first_unstorable(data: Any) -> tuple[str, str] | None:
    """The first string in a JSON document that cannot be stored.

    Returns (param path, reason), the path in OpenAI's spelling
    (``messages[0].content``; for a bad key, the object holding it, "" for
    the document itself), or None. Walks with an explicit stack, so no nesting depth can exhaust
    the interpreter's recursion limit.
    """
    stack: list[tuple[str, Any]] = [("", data)]
    while stack:
        path, value = stack.pop()
        if isinstance(value, str):
            reason = unstorable_reason(value)
            if reason is not None:
                return path, reason
        elif isinstance(value, dict):
            for key in value:
                reason = unstorable_reason(key) if isinstance(key, str) else None
                if reason is not None:
                    # A key is named by its object: the key itself may not print.
                    return path, f"a key {reason[3:]}"
            for key, item in reversed(value.items()):
                stack.append((f"{path}.{key}" if path else str(key), item))
        elif isinstance(value, list):
            for i in range(len(value) - 1, -1, -1):
                stack.append((f"{path}[{i}]", value[i]))
    return None
