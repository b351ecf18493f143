"""Tool calls read out of a reply, as records (OpenAI's JSON at the edge only).

``ToolCallDelta`` is one streamed piece of a call, ``ToolCall`` a whole
one; ``ToolChoiceDelta`` is a choice's delta with the calls its text held
(``inference.tool_calls.output`` rewrites a response's events into them).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from wire.events import ChoiceDelta


@dataclass(slots=True)
class ToolCallDelta:
    """One streamed piece of a tool call: its first carries id and name."""

    index: int
    arguments: str = ""
    id: str | None = None
    name: str | None = None

    def payload(self) -> dict[str, Any]:
        """OpenAI's ``delta.tool_calls`` item."""
        if self.id is None:
            return {"index": self.index, "function": {"arguments": self.arguments}}
        return {
            "index": self.index,
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, "arguments": self.arguments},
        }


@dataclass(slots=True, frozen=True)
class ToolCall:
    """A whole tool call of a reply."""

    id: str
    name: str
    # A JSON text (OpenAI's shape), as the model wrote it.
    arguments: str

    def payload(self) -> dict[str, Any]:
        """OpenAI's ``message.tool_calls`` item."""
        return {
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, "arguments": self.arguments},
        }


@dataclass(slots=True, frozen=True)
class ToolChoiceDelta(ChoiceDelta):
    """A choice's delta whose text was read for tool calls: ``text`` is the
    content only, ``tool_calls`` the pieces of calls it held."""

    tool_calls: tuple[ToolCallDelta, ...] = ()
