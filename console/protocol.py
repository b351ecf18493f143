"""The console chat socket's frames (notes: ws_protocol.md), as plain data.

Parsing turns a client frame into a typed command or raises ProtocolError;
``client_frame`` turns a bus event into what the browser receives. Nothing
here touches the database or the bus, so the consumer stays a relay.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any

from inference.errors import APIError, ContextLengthExceeded, InsufficientQuota
from inference.storable import unstorable_reason
from wire.events import Delta, Event, Terminal

# A message is one turn typed by a person; the tier's context cap bounds
# what the model sees, this bounds what one frame may carry.
MAX_CONTENT_CHARS = 32_000


class ProtocolError(Exception):
    """A frame the server refuses; sent back as an ``error`` frame."""

    def __init__(self, message: str, *, code: str = "invalid_message"):
        super().__init__(message)
        self.message = message
        self.code = code


@dataclass(slots=True, frozen=True)
class Send:
    conversation_id: int | None
    content: str
    model: str


@dataclass(slots=True, frozen=True)
class Regenerate:
    conversation_id: int


@dataclass(slots=True, frozen=True)
class Stop:
    response_id: str


@dataclass(slots=True, frozen=True)
class Resume:
    response_id: str
    after_seq: int


Command = Send | Regenerate | Stop | Resume


def _int(frame: dict, name: str, *, optional: bool = False, minimum: int = 1) -> int | None:
    value = frame.get(name)
    if value is None and optional:
        return None
    # bool is an int in Python; a JSON true is not a valid id.
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise ProtocolError(f"'{name}' must be an integer of at least {minimum}.")
    return value


# What a person reads when a field of theirs is refused; other fields come
# from the page's own code, so their errors name the field.
_EMPTY = {"content": "Type a message first.", "model": "Pick a model first."}
_TOO_LONG = {"content": "Your message is too long (max {max:,} characters)."}
_UNSTORABLE = {
    "content": "Your message contains a character that cannot be sent (a NUL character "
    "or invalid Unicode); remove it and send again."
}


def _str(frame: dict, name: str, *, max_length: int) -> str:
    value = frame.get(name)
    if not isinstance(value, str) or not value.strip():
        raise ProtocolError(_EMPTY.get(name, f"'{name}' must be a non-empty string."))
    if len(value) > max_length:
        message = _TOO_LONG.get(name, "'{name}' is longer than {max} characters.")
        raise ProtocolError(message.format(name=name, max=max_length))
    # NUL and lone surrogates: no store can hold them (inference.storable),
    # and a lookup with one must fail here, not in the database.
    reason = unstorable_reason(value)
    if reason is not None:
        raise ProtocolError(_UNSTORABLE.get(name, f"'{name}' is invalid: {reason}."))
    return value


def parse_command(frame: Any) -> Command:
    if not isinstance(frame, dict):
        raise ProtocolError("A frame must be a JSON object.")
    kind = frame.get("type")
    if kind == "chat.send":
        return Send(
            conversation_id=_int(frame, "conversation_id", optional=True),
            content=_str(frame, "content", max_length=MAX_CONTENT_CHARS),
            model=_str(frame, "model", max_length=128),
        )
    if kind == "chat.regenerate":
        return Regenerate(conversation_id=_int(frame, "conversation_id"))
    if kind == "chat.stop":
        return Stop(response_id=_str(frame, "response_id", max_length=64))
    if kind == "chat.resume":
        return Resume(
            response_id=_str(frame, "response_id", max_length=64),
            after_seq=_int(frame, "after_seq", minimum=0),
        )
    raise ProtocolError(f"Unknown frame type: {kind!r}.", code="unknown_type")


def started_frame(*, conversation_id: int, message_id: int, response_id: str) -> dict:
    return {
        "type": "response.started",
        "conversation_id": conversation_id,
        "message_id": message_id,
        "response_id": response_id,
    }


def client_frame(event: Event, response_id: str) -> dict[str, Any] | None:
    """The browser's frame for one bus event; None for ``created``."""
    if isinstance(event, Delta):
        text = "".join(c.text for c in event.choices if c.index == 0)
        return {"type": "delta", "response_id": response_id, "seq": event.seq, "text": text}
    if isinstance(event, Terminal):
        usage, error = event.usage, event.error
        return {
            "type": event.type.value,
            "response_id": response_id,
            "seq": event.seq,
            "finish_reason": event.finish_reason,
            "usage": {
                "prompt_tokens": usage.prompt_tokens,
                "completion_tokens": usage.completion_tokens,
                "total_tokens": usage.prompt_tokens + usage.completion_tokens,
            },
            "error": {"message": error.message, "code": error.code} if error else None,
        }
    return None


def error_frame(code: str, message: str, retry_after: float | None = None) -> dict[str, Any]:
    return {"type": "error", "code": code, "message": message, "retry_after": retry_after}


# The API's messages are for programs ("... 1 in the completion"); the
# console says the same in a person's words. Codes not here keep the API's.
_USER_WORDS = {
    "model_warming_up": "The model is warming up (it loads after the server starts).",
    "no_worker_available": "No server is running this model right now. Try again later.",
    "bus_unavailable": "The chat service is unreachable for a moment. Try again shortly.",
    "server_draining": "The server is restarting. Send your message again in a moment.",
    "queue_wait_exceeded": "The model is too busy to answer in time right now.",
    "concurrency": "Your organization has too many replies in progress; wait for one to end.",
    "requests": "Your organization has reached its limit of requests per minute.",
    "tokens": "Your organization has reached its limit of tokens per minute.",
    "insufficient_quota": "Your organization has used its monthly token quota.",
    "string_above_max_length": "This message is too long to send. Please shorten it.",
}


def user_message(exc: APIError) -> str:
    """``exc``'s message in a person's words, for the console."""
    if isinstance(exc, ContextLengthExceeded) and exc.limit is not None:
        if (exc.prompt_tokens or 0) >= exc.limit:
            return (
                f"This conversation is too long for the model ({exc.prompt_tokens:,} tokens; "
                f"it reads at most {exc.limit:,}). Start a new chat to go on."
            )
        return (
            f"This conversation leaves the model no room to answer (it reads at most "
            f"{exc.limit:,} tokens). Start a new chat to go on."
        )
    if exc.code == "rate_limit_exceeded":
        key = "concurrency" if exc.message.startswith("Too many concurrent") else exc.type
        return _USER_WORDS.get(key, exc.message)
    if exc.code == "insufficient_quota" and "budget" in exc.message:
        # The budget stop's message already speaks to people, with amounts.
        return exc.message
    return _USER_WORDS.get(exc.code or "", exc.message)


def refusal_frame(exc: APIError, *, now: dt.datetime | None = None) -> dict[str, Any]:
    """An ``error`` frame for a refused request, saying when a retry can work."""
    retry_after = getattr(exc, "retry_after", None)
    if isinstance(exc, InsufficientQuota):
        # The monthly quota resets when the next month starts (UTC).
        now = now or dt.datetime.now(dt.UTC)
        next_month = (now.replace(day=1) + dt.timedelta(days=32)).replace(
            day=1, hour=0, minute=0, second=0, microsecond=0
        )
        retry_after = (next_month - now).total_seconds()
    return error_frame(exc.code or exc.type, user_message(exc), retry_after)
