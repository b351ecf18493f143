"""Every text of a prompt that reaches the model, for the prompt's screen.

Not only the messages' contents: the chat template also renders the tools
(names, descriptions, the parameters schemas) and the arguments of earlier
tool calls, so a deny-listed word or an e-mail address there reaches the
model as surely as in a message. ``screen_texts`` lists them all, in one
order; ``with_screened`` puts the screened (PII-redacted) texts back in the
same order.

A text is ``verbatim`` when the model must see it as the client sent it:
tool names (the reply's tool calls are matched against them), schema keys
and every schema string but free text (``enum`` values, ``pattern``: the
grammar enforces them as sent, so a redacted copy in the prompt would
contradict what the output must be), and keys of call arguments. PII in a
verbatim text under a ``redact`` policy blocks the prompt
(``safety.moderation.texts_moderate``), since it cannot be redacted
consistently. A prompt's verbatim strings are screened joined, one text a
tool or call, so a schema of many keys costs one screen, not hundreds.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import Any

from inference.request import Prompt, TextPrompt

# Joins a tool's verbatim strings: neither a word character nor whitespace,
# so no deny-list phrase and no PII pattern runs across two strings.
SEPARATOR = "\n|\n"
# Deeper call arguments are screened as one raw text (the rebuild recurses).
MAX_DEPTH = 64
# A schema's free text: shown to the model, enforced by nothing.
FREE_TEXT_KEYS = frozenset({"description", "title", "examples", "default", "$comment"})


@dataclass(slots=True, frozen=True)
class ScreenText:
    text: str
    # The API parameter it came from, for the 400 when it is too long.
    param: str
    verbatim: bool = False


def screen_texts(prompt: Prompt) -> list[ScreenText]:
    """The texts of ``prompt`` that reach the model, in ``with_screened``'s order."""
    if isinstance(prompt, TextPrompt):
        return [ScreenText(prompt.text, "prompt")]
    out = [ScreenText(turn.text, "messages") for turn in prompt.turns]
    for turn in prompt.turns:
        for call in turn.tool_calls:
            out.extend(_call_texts(call.name, call.arguments))
    for tool in prompt.template_tools or ():
        out.extend(_tool_texts(tool))
    return out


def with_screened(prompt: Prompt, texts: list[str]) -> Prompt:
    """``prompt`` with its texts replaced by ``texts`` (``screen_texts``' order).

    Verbatim texts are never changed by the screen, so only free ones are
    put back; a JSON document is rewritten only where a string changed.
    """
    if isinstance(prompt, TextPrompt):
        return prompt.with_texts(texts)
    given = iter(texts)
    turns = [replace(turn, text=next(given)) for turn in prompt.turns]
    for i, turn in enumerate(turns):
        if turn.tool_calls:
            calls = tuple(
                replace(call, arguments=_call_put_back(call.arguments, given))
                for call in turn.tool_calls
            )
            turns[i] = replace(turn, tool_calls=calls)
    tools = prompt.template_tools
    if tools is not None:
        tools = [_tool_put_back(tool, given) for tool in tools]
    if next(given, None) is not None:
        raise ValueError("more screened texts than the prompt has")
    return replace(prompt, turns=tuple(turns), template_tools=tools)


def _call_texts(name: str, arguments: str) -> list[ScreenText]:
    value = _json_document(arguments)
    if value is None:
        # Not a JSON object: rendered as it is, redacted as it is.
        return [ScreenText(name, "messages", verbatim=True), ScreenText(arguments, "messages")]
    free: list[str] = []
    fixed: list[str] = [name]
    _walk(value, free, fixed, free_context=True)
    return [ScreenText(SEPARATOR.join(fixed), "messages", verbatim=True)] + [
        ScreenText(text, "messages") for text in free
    ]


def _call_put_back(arguments: str, given: Iterator[str]) -> str:
    value = _json_document(arguments)
    next(given)  # the verbatim text
    if value is None:
        return next(given)
    changed = [False]
    rebuilt = _rebuild(value, given, changed, free_context=True)
    return json.dumps(rebuilt, ensure_ascii=False) if changed[0] else arguments


def _tool_texts(tool: dict[str, Any]) -> list[ScreenText]:
    free: list[str] = []
    fixed: list[str] = []
    _walk(tool, free, fixed, free_context=False)
    return [ScreenText(SEPARATOR.join(fixed), "tools", verbatim=True)] + [
        ScreenText(text, "tools") for text in free
    ]


def _tool_put_back(tool: dict[str, Any], given: Iterator[str]) -> dict[str, Any]:
    next(given)  # the verbatim text
    changed = [False]
    rebuilt = _rebuild(tool, given, changed, free_context=False)
    return rebuilt if changed[0] else tool


def _json_document(text: str) -> dict | list | None:
    """The arguments as a JSON object or array; None for anything else,
    or nested deeper than MAX_DEPTH (screened as one raw text then)."""
    try:
        value = json.loads(text)
    except (ValueError, RecursionError):
        return None
    if not isinstance(value, dict | list):
        return None
    stack = [(value, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > MAX_DEPTH:
            return None
        children = node.values() if isinstance(node, dict) else node
        stack.extend((c, depth + 1) for c in children if isinstance(c, dict | list))
    return value


def _walk(value: Any, free: list[str], fixed: list[str], *, free_context: bool) -> None:
    """Strings of ``value`` in document order: keys and (outside free
    context) values are ``fixed``; free-context string values ``free``.
    A tool's free context is what FREE_TEXT_KEYS hold; a call's arguments
    are all free."""
    stack: list[tuple[Any, bool]] = [(value, free_context)]
    while stack:
        node, context = stack.pop()
        if isinstance(node, str):
            (free if context else fixed).append(node)
        elif isinstance(node, dict):
            items = []
            for key, item in node.items():
                fixed.append(key)
                items.append((item, context or key in FREE_TEXT_KEYS))
            stack.extend(reversed(items))
        elif isinstance(node, list):
            stack.extend((item, context) for item in reversed(node))


def _rebuild(value: Any, given: Iterator[str], changed: list[bool], *, free_context: bool) -> Any:
    """``value`` with its free strings taken from ``given`` (``_walk``'s order)."""
    if isinstance(value, str):
        if not free_context:
            return value
        text = next(given)
        changed[0] = changed[0] or text != value
        return text
    if isinstance(value, dict):
        return {
            key: _rebuild(item, given, changed, free_context=free_context or key in FREE_TEXT_KEYS)
            for key, item in value.items()
        }
    if isinstance(value, list):
        return [_rebuild(item, given, changed, free_context=free_context) for item in value]
    return value
