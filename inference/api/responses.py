"""``/v1/responses``: OpenAI's Responses API for text, on the chat path.

The request's ``instructions`` and ``input`` (text, or message items with
``input_text`` / ``output_text`` parts) become the chat turns of an
``InferenceRequest`` and go through ``services.generation_start`` like a
chat completion: the same auth, tiers, limits, budgets, usage records,
moderation and cancellation.

No server-side storage: ``store`` is accepted (true is OpenAI's default)
but nothing is kept, so ``GET /v1/responses/{id}`` is not offered and
``previous_response_id`` is a 400 saying so; clients carry the
conversation in ``input`` instead.

Streams are typed events (``response.created`` ... ``response.completed``)
with a rising ``sequence_number`` from 0, framed as OpenAI frames them
(``event: <type>`` then ``data: {json}``, no ``[DONE]``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

from django.http import JsonResponse
from pydantic import Field, field_validator

from inference import services
from inference.api.openai_format import CompletionBuilder, ending_error
from inference.api.schemas import ENCODABLE, RequestBody, StrictSchema
from inference.api.sse import stream_response
from inference.errors import InvalidRequest
from inference.relay.tap import (
    ResponseTap,
    collect,
    ended_badly,
    failed_error,
    release_db_connection,
)
from inference.request import ChatPrompt, ChatTurn, InferenceRequest, new_response_id
from tenants.models import ApiKey, Tenant
from wire.events import Created, Delta, Event, Terminal, TokenUsage
from wire.sampling import Sampling
from wire.tracing import TraceContext

Text = Annotated[str, ENCODABLE]


class InputText(StrictSchema):
    type: Literal["input_text", "output_text"]
    text: Text
    # output_text parts of an earlier reply may carry these; they are ignored.
    annotations: list | None = None


class InputMessage(StrictSchema):
    type: Literal["message"] | None = None
    role: Literal["user", "system", "developer", "assistant"]
    content: Text | Annotated[list[InputText], Field(min_length=1)]

    @property
    def text(self) -> str:
        if isinstance(self.content, str):
            return self.content
        return "\n".join(part.text for part in self.content)


class ResponsesRequest(RequestBody):
    model: Annotated[str, Field(min_length=1, max_length=128), ENCODABLE]
    input: Text | Annotated[list[InputMessage], Field(min_length=1)]
    instructions: Text | None = None
    max_output_tokens: Annotated[int, Field(ge=1)] | None = None
    temperature: Annotated[float, Field(ge=0, le=2)] | None = None
    top_p: Annotated[float, Field(ge=0, le=1)] | None = None
    stream: bool | None = None
    # Accepted for compatibility; nothing is stored either way.
    store: bool | None = None
    previous_response_id: str | None = None
    user: Annotated[str, Field(max_length=256), ENCODABLE] | None = None
    metadata: (
        Annotated[dict[str, Annotated[str, Field(max_length=512)]], Field(max_length=16)] | None
    ) = None

    @field_validator("previous_response_id")
    @classmethod
    def _no_previous(cls, value: str | None) -> str | None:
        if value is not None:
            raise InvalidRequest(
                "previous_response_id is not supported: this server stores no responses "
                "(store is accepted but ignored). Send the earlier turns in 'input'.",
                param="previous_response_id",
            )
        return value


def response_request(request: ResponsesRequest, *, tenant: Tenant) -> InferenceRequest:
    """The internal request: instructions first, as a system turn."""
    turns = [] if request.instructions is None else [ChatTurn("system", request.instructions)]
    if isinstance(request.input, str):
        turns.append(ChatTurn("user", request.input))
    else:
        turns.extend(ChatTurn(m.role, m.text) for m in request.input)
    top_p = 1.0 if request.top_p is None else request.top_p
    temperature = 1.0 if request.temperature is None else request.temperature
    if top_p == 0:
        # As chat: the nucleus always keeps the most likely token (greedy).
        temperature, top_p = 0.0, 1.0
    return InferenceRequest(
        model=request.model,
        prompt=ChatPrompt(tuple(turns)),
        sampling=Sampling(
            max_tokens=request.max_output_tokens, temperature=temperature, top_p=top_p
        ),
        tenant_id=tenant.pk,
        tier=tenant.tier.name,
        response_id=new_response_id("resp"),
        trace=TraceContext.current(),
        max_tokens_param="max_output_tokens",
        user=request.user,
    )


async def responses_create(*, api_key: ApiKey, request: ResponsesRequest):
    """Admit the request, then answer one ``response`` (or its typed event stream)."""
    tenant = api_key.tenant
    tap = await services.generation_start(
        request=response_request(request, tenant=tenant), tenant=tenant, api_key=api_key
    )
    shape = ResponseShape.of(request, tap)
    if request.stream:
        return await stream_response(
            tap, frames=ResponseEvents(shape), named_events=True, done_marker=False
        )
    return await _collected(tap, shape)


@dataclass(slots=True)
class ResponseShape:
    """The fixed fields of one response object, and how to fill the rest."""

    request: ResponsesRequest
    response_id: str
    model: str
    created_at: int

    @classmethod
    def of(cls, request: ResponsesRequest, tap: ResponseTap) -> ResponseShape:
        return cls(request, tap.route.response_id, tap.route.model, int(time.time()))

    @property
    def message_id(self) -> str:
        return "msg_" + self.response_id.split("-", 1)[-1]

    def message(self, text: str, status: str) -> dict[str, Any]:
        content = [] if status == "in_progress" else [output_text(text)]
        return {
            "id": self.message_id,
            "type": "message",
            "status": status,
            "role": "assistant",
            "content": content,
        }

    def body(
        self,
        status: str,
        *,
        text: str | None = None,
        usage: TokenUsage | None = None,
        error: dict[str, Any] | None = None,
        incomplete: str | None = None,
    ) -> dict[str, Any]:
        r = self.request
        output = [] if text is None else [self.message(text, "completed")]
        return {
            "id": self.response_id,
            "object": "response",
            "created_at": self.created_at,
            "status": status,
            "error": error,
            "incomplete_details": {"reason": incomplete} if incomplete else None,
            "instructions": r.instructions,
            "max_output_tokens": r.max_output_tokens,
            "model": self.model,
            "output": output,
            "parallel_tool_calls": False,
            "previous_response_id": None,
            "store": False,
            "temperature": 1.0 if r.temperature is None else r.temperature,
            "text": {"format": {"type": "text"}},
            "tool_choice": "none",
            "tools": [],
            "top_p": 1.0 if r.top_p is None else r.top_p,
            "truncation": "disabled",
            "usage": response_usage(usage) if usage is not None else None,
            "user": r.user,
            "metadata": r.metadata or {},
        }


def output_text(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def response_usage(usage: TokenUsage) -> dict[str, Any]:
    """The usage object in the Responses API's names."""
    return {
        "input_tokens": usage.prompt_tokens,
        "input_tokens_details": {"cached_tokens": usage.cached_tokens},
        "output_tokens": usage.completion_tokens,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": usage.prompt_tokens + usage.completion_tokens,
    }


def _ending(finish_reason: str | None) -> tuple[str, str | None]:
    """(status, incomplete reason) for a choice's finish_reason."""
    if finish_reason == "length":
        return "incomplete", "max_output_tokens"
    if finish_reason == "content_filter":
        return "incomplete", "content_filter"
    return "completed", None


def _error(event: Terminal) -> dict[str, Any]:
    """The Responses API's error object for a failed or cancelled ending."""
    error = ending_error(event)
    return {"code": error.code or "server_error", "message": error.message or ""}


@dataclass(slots=True)
class ResponseEvents:
    """Bus events -> the Responses API's typed stream events."""

    shape: ResponseShape
    builder: CompletionBuilder = field(init=False)
    sequence: int = 0
    text: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        s = self.shape
        self.builder = CompletionBuilder(s.response_id, s.model, s.created_at, 1, False)

    def _event(self, type_: str, **fields: Any) -> dict[str, Any]:
        event = {"type": type_, "sequence_number": self.sequence, **fields}
        self.sequence += 1
        return event

    def _part(self, **fields: Any) -> dict[str, Any]:
        return {"item_id": self.shape.message_id, "output_index": 0, "content_index": 0, **fields}

    def payloads(self, event: Event) -> list[dict[str, Any]]:
        self.builder.add(event)
        s = self.shape
        if isinstance(event, Created):
            return [
                self._event("response.created", response=s.body("in_progress")),
                self._event("response.in_progress", response=s.body("in_progress")),
                self._event(
                    "response.output_item.added",
                    output_index=0,
                    item=s.message("", "in_progress"),
                ),
                self._event("response.content_part.added", **self._part(part=output_text(""))),
            ]
        if isinstance(event, Delta):
            delta = "".join(c.text for c in event.choices if c.index == 0)
            if not delta:
                return []
            self.text.append(delta)
            return [
                self._event("response.output_text.delta", **self._part(delta=delta, logprobs=[]))
            ]
        if not isinstance(event, Terminal):
            return []
        if ended_badly(event):
            return [self._event("response.failed", response=s.body("failed", error=_error(event)))]
        text = "".join(self.text)
        status, reason = _ending(self.builder.finish_reason(event))
        body = s.body(status, text=text, usage=self.builder.ledger.usage(event), incomplete=reason)
        return [
            self._event("response.output_text.done", **self._part(text=text, logprobs=[])),
            self._event("response.content_part.done", **self._part(part=output_text(text))),
            self._event(
                "response.output_item.done", output_index=0, item=s.message(text, "completed")
            ),
            # response.completed even when the status is incomplete: the
            # SDK's stream helper waits for that event to hand back the result.
            self._event("response.completed", response=body),
        ]


async def _collected(tap: ResponseTap, shape: ResponseShape) -> JsonResponse:
    builder = CompletionBuilder(shape.response_id, shape.model, shape.created_at, 1, False)
    await release_db_connection()
    try:
        event = await collect(tap, builder)
    except BaseException:
        tap.abandon()
        raise
    if ended_badly(event):
        error = failed_error(event)
        error.headers = {**tap.headers, **error.headers}
        raise error
    status, reason = _ending(builder.finish_reason(event))
    usage = builder.ledger.usage(event)
    response = JsonResponse(shape.body(status, text=builder.text(), usage=usage, incomplete=reason))
    for name, value in tap.headers.items():
        response[name] = value
    return response
