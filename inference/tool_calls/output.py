"""A response's events with its choices' text read for tool calls.

``ToolCallEvents`` rewrites each delta event's choices: ``text`` becomes
the content only, ``tool_calls`` carries OpenAI tool-call deltas, and a
choice that called a tool and stopped finishes with ``tool_calls``. Text
held back at a choice's end goes out in a delta of its own before the
terminal event. The relay's formatters (``ChunkStream``,
``CompletionBuilder``) read the rewritten events through the wrappers
below; usage and billing read the engine's events untouched.
"""

from __future__ import annotations

import hashlib
from dataclasses import replace
from typing import Any

from inference.api.openai_format import ChunkStream, CompletionBuilder
from inference.tool_calls.extractor import ToolCallExtractor, merge_tool_calls
from inference.tool_calls.records import ToolCallDelta, ToolChoiceDelta
from inference.tool_calls.setup import ToolParsing
from wire.events import ChoiceDelta, Delta, Event, EventType, Terminal


def call_id(response_id: str, choice: int, call: int) -> str:
    """A tool call's id: derived, so a resumed stream repeats it exactly."""
    digest = hashlib.sha256(f"{response_id}:{choice}:{call}".encode()).hexdigest()
    return f"call_{digest[:24]}"


class ToolCallEvents:
    """Rewrites one response's events for its tool calls, one extractor per choice."""

    __slots__ = ("parsing", "response_id", "n", "_extractors", "_finished")

    def __init__(self, parsing: ToolParsing, response_id: str, n: int):
        self.parsing = parsing
        self.response_id = response_id
        self.n = n
        self._extractors: dict[int, ToolCallExtractor] = {}
        self._finished: set[int] = set()

    def _extractor(self, index: int) -> ToolCallExtractor:
        extractor = self._extractors.get(index)
        if extractor is None:
            ids = lambda k: call_id(self.response_id, index, k)  # noqa: E731
            extractor = self._extractors[index] = ToolCallExtractor(self.parsing, ids)
        return extractor

    def _reason(self, index: int, reason: str | None) -> str | None:
        if reason == "stop" and self._extractor(index).calls:
            return "tool_calls"
        return reason

    def events(self, event: Event) -> list[Event]:
        """The rewritten event, preceded at a normal ending by held-back text."""
        if isinstance(event, Delta):
            return [replace(event, choices=tuple(self._choice(c) for c in event.choices))]
        if not isinstance(event, Terminal) or event.type not in (
            EventType.COMPLETED,
            EventType.INCOMPLETE,
        ):
            return [event]
        choices = []
        for index in range(self.n):
            if index in self._finished:
                continue
            out = self._extractor(index).finish()
            if out.content or out.tool_calls:
                choices.append(
                    ToolChoiceDelta(index, out.content, tool_calls=tuple(out.tool_calls))
                )
        reasons = dict(event.finish_reasons)
        for index in range(self.n):
            if index not in self._finished and index in reasons:
                reasons[index] = self._reason(index, reasons[index])
        terminal = replace(event, finish_reasons=reasons)
        if not choices:
            return [terminal]
        return [Delta(event.seq, tuple(choices)), terminal]

    def _choice(self, choice: ChoiceDelta) -> ToolChoiceDelta:
        index = choice.index
        extractor = self._extractor(index)
        out = extractor.feed(choice.text)
        calls = out.tool_calls
        reason = choice.finish_reason
        if reason:
            last = extractor.finish()
            out.content += last.content
            calls = merge_deltas(calls + last.tool_calls)
            self._finished.add(index)
        return ToolChoiceDelta(
            index,
            out.content,
            choice.token_ids,
            choice.logprobs,
            self._reason(index, reason),
            tool_calls=tuple(calls),
        )


def merge_deltas(deltas: list[ToolCallDelta]) -> list[ToolCallDelta]:
    """Consecutive deltas of one call as one (fewer, larger fragments)."""
    merged: list[ToolCallDelta] = []
    for delta in deltas:
        if merged and merged[-1].index == delta.index:
            merged[-1].arguments += delta.arguments
        else:
            merged.append(replace(delta))
    return merged


class ToolChunkStream:
    """``ChunkStream`` over the rewritten events (same ``payloads`` API)."""

    __slots__ = ("chunks", "rewriter")

    def __init__(self, chunks: ChunkStream, rewriter: ToolCallEvents):
        self.chunks = chunks
        self.rewriter = rewriter

    def payloads(self, event: Event) -> list[dict[str, Any]]:
        out = []
        for rewritten in self.rewriter.events(event):
            out.extend(self.chunks.payloads(rewritten))
        return out


class ToolCompletionBuilder:
    """``CompletionBuilder`` over the rewritten events, adding ``message.tool_calls``."""

    __slots__ = ("builder", "rewriter", "_deltas", "_terminal")

    def __init__(self, builder: CompletionBuilder, rewriter: ToolCallEvents):
        self.builder = builder
        self.rewriter = rewriter
        self._deltas: dict[int, list[ToolCallDelta]] = {}
        self._terminal: Terminal | None = None

    def add(self, event: Event) -> None:
        for rewritten in self.rewriter.events(event):
            self.builder.add(rewritten)
            if isinstance(rewritten, Delta):
                for c in rewritten.choices:
                    if isinstance(c, ToolChoiceDelta):
                        self._deltas.setdefault(c.index, []).extend(c.tool_calls)
            elif isinstance(rewritten, Terminal):
                self._terminal = rewritten

    def result(self, terminal: Terminal) -> dict[str, Any]:
        result = self.builder.result(self._terminal or terminal)
        for choice in result["choices"]:
            calls = merge_tool_calls(self._deltas.get(choice["index"], []))
            if calls:
                message = choice["message"]
                message["tool_calls"] = [call.payload() for call in calls]
                message["content"] = message["content"] or None
        return result


def with_tool_calls(formatter, route) -> Any:
    """``formatter`` reading ``route``'s tool calls, when its request had tools."""
    if route.tool_parsing is None:
        return formatter
    rewriter = ToolCallEvents(route.tool_parsing, route.response_id, route.n)
    if isinstance(formatter, ChunkStream):
        return ToolChunkStream(formatter, rewriter)
    return ToolCompletionBuilder(formatter, rewriter)
