"""The internal generation request: what every surface hands the request path.

Each surface builds an ``InferenceRequest`` from its own schema (chat
completions, completions, the Responses API, the console; the Batch API's
lines will too), and the services take this record, never an API schema:
``services.generation_start`` screens its prompt, prepares it (chat
template or plain text, context and output caps), takes the claims on the
tenant's limits and dispatches it as a ``wire.requests.GenerationRequest``.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from fleet.routing import conversation_routing_key
from inference.tool_calls.setup import ToolParsing
from wire.requests import ServiceClass
from wire.sampling import Sampling
from wire.tracing import TraceContext


@dataclass(slots=True, frozen=True)
class ToolCallRef:
    """A tool call an assistant turn made earlier in the conversation."""

    id: str
    name: str
    # The arguments as the JSON text the API returned.
    arguments: str


@dataclass(slots=True, frozen=True)
class ChatTurn:
    """One message of a conversation, as the chat template renders it."""

    role: str
    text: str
    tool_calls: tuple[ToolCallRef, ...] = ()
    # A tool result's call.
    tool_call_id: str | None = None


@dataclass(slots=True, frozen=True)
class ChatPrompt:
    """Chat turns, rendered with the model's chat template (and tools)."""

    turns: tuple[ChatTurn, ...]
    # OpenAI-shaped tool definitions, a JSON document the template renders;
    # None: no tools in the prompt.
    template_tools: list[dict[str, Any]] | None = None
    # How to read tool calls out of the reply; None: plain text.
    tool_parsing: ToolParsing | None = None
    # The sampling's structured_output comes from tool_choice, not from
    # response_format (the 400 for a bad one names that parameter).
    constrained_by_tools: bool = False
    # What the model reads of it, for the safety screen, and the screened
    # texts put back: inference.prompts.screened (tool text included).


@dataclass(slots=True, frozen=True)
class TextPrompt:
    """A prompt tokenized as it is, without a chat template."""

    text: str
    # Token ids the client sent (``text`` is their decoding, for moderation
    # and echo); served as given unless moderation changed the text.
    token_ids: tuple[int, ...] | None = None

    def with_texts(self, texts: Sequence[str]) -> TextPrompt:
        (text,) = texts
        return self if text == self.text else TextPrompt(text)


Prompt = ChatPrompt | TextPrompt


def new_response_id(prefix: str = "chatcmpl") -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


@dataclass(slots=True, frozen=True)
class InferenceRequest:
    """One response to generate, whatever surface asked for it."""

    model: str
    prompt: Prompt
    # max_tokens None: as many as the tier's output cap and the context allow.
    sampling: Sampling
    tenant_id: int
    # The tenant's tier's name (the wire request and scheduling carry it).
    tier: str
    response_id: str
    trace: TraceContext
    service_class: ServiceClass = ServiceClass.DEFAULT
    # The name the client gave the output cap (max_tokens,
    # max_completion_tokens, max_output_tokens), for the 400 naming it.
    max_tokens_param: str = "max_tokens"
    # Bounds a request that sets no cap below the tier's (console replies).
    default_max_tokens: int | None = None
    # Billing's UsageRecord.Source ("api", "console").
    source: str = "api"
    # An answer asked for again (the console's regenerate).
    regenerated: bool = False
    # Keeps a conversation's turns on the replica holding its KV cache
    # (fleet.routing), with OpenAI's ``user`` as a tie-breaker.
    conversation_id: str | None = None
    user: str | None = None
    # Streamed with a final usage chunk (stream_options.include_usage).
    include_usage: bool = False

    def routing_key(self) -> str:
        """The conversation this request continues (``fleet.routing``)."""
        prompt = self.prompt
        turns = prompt.turns if isinstance(prompt, ChatPrompt) else (ChatTurn("user", prompt.text),)
        return conversation_routing_key(
            messages=turns, conversation_id=self.conversation_id, user=self.user
        )
