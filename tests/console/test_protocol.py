"""Parsing client frames and rendering server frames (no socket, no database)."""

import datetime as dt

import pytest

from console.protocol import (
    ProtocolError,
    Resume,
    Send,
    client_frame,
    parse_command,
    refusal_frame,
)
from inference.errors import (
    ContextLengthExceeded,
    InsufficientQuota,
    RateLimited,
    ServiceUnavailable,
    rate_limit_error,
)
from tenants.ratelimit.base import Decision
from wire.events import ChoiceDelta, Created, Delta, ErrorInfo, EventType, Terminal, TokenUsage


def test_send_and_resume_are_parsed():
    send = parse_command(
        {"type": "chat.send", "conversation_id": None, "content": "hi", "model": "m"}
    )
    assert send == Send(conversation_id=None, content="hi", model="m")
    resume = parse_command({"type": "chat.resume", "response_id": "r", "after_seq": 0})
    assert resume == Resume(response_id="r", after_seq=0)


@pytest.mark.parametrize(
    "frame",
    [
        [],
        {"type": "chat.send", "conversation_id": "1", "content": "hi", "model": "m"},
        {"type": "chat.send", "conversation_id": True, "content": "hi", "model": "m"},
        {"type": "chat.send", "conversation_id": None, "content": "", "model": "m"},
        {"type": "chat.send", "conversation_id": None, "content": "x" * 32_001, "model": "m"},
        {"type": "chat.resume", "response_id": "r", "after_seq": -1},
        {"type": "chat.stop"},
    ],
)
def test_invalid_frames_are_refused(frame):
    with pytest.raises(ProtocolError):
        parse_command(frame)


def test_delta_and_terminal_frames():
    delta = Delta(3, (ChoiceDelta(0, "Hi", (1,)),))
    assert client_frame(delta, "r") == {"type": "delta", "response_id": "r", "seq": 3, "text": "Hi"}
    created = Created(response_id="r", model="m", worker_id="w", prompt_tokens=5)
    assert client_frame(created, "r") is None
    failed = Terminal(
        EventType.FAILED,
        4,
        TokenUsage(prompt_tokens=5, completion_tokens=1),
        error=ErrorInfo("lost", code="worker_lost"),
    )
    assert client_frame(failed, "r") == {
        "type": "failed",
        "response_id": "r",
        "seq": 4,
        "finish_reason": None,
        "usage": {"prompt_tokens": 5, "completion_tokens": 1, "total_tokens": 6},
        "error": {"message": "lost", "code": "worker_lost"},
    }


def test_refusals_say_when_to_retry():
    """A rate limit carries its Retry-After; the monthly quota waits for next month."""
    limited = refusal_frame(RateLimited("slow down", retry_after=12.5))
    assert (limited["code"], limited["retry_after"]) == ("rate_limit_exceeded", 12.5)
    now = dt.datetime(2026, 11, 30, 12, 0, tzinfo=dt.UTC)
    quota = refusal_frame(InsufficientQuota(), now=now)
    assert quota["code"] == "insufficient_quota"
    assert quota["retry_after"] == 12 * 3600


def test_refused_fields_are_worded_for_people():
    """The composer's own fields say what to do, not which JSON key failed."""
    too_long = {"type": "chat.send", "conversation_id": None, "content": "x" * 32_001, "model": "m"}
    with pytest.raises(
        ProtocolError, match=r"^Your message is too long \(max 32,000 characters\)\.$"
    ):
        parse_command(too_long)
    with pytest.raises(ProtocolError, match="^Type a message first.$"):
        parse_command({**too_long, "content": "  "})


def test_refusals_are_worded_for_people():
    """The API's wording for programs ("1 in the completion", RPM counters)
    becomes a sentence a person can act on; warming up says when to retry."""
    long_chat = ContextLengthExceeded("API wording", limit=8192, prompt_tokens=9000)
    message = refusal_frame(long_chat)["message"]
    assert message == (
        "This conversation is too long for the model (9,000 tokens; it reads at most 8,192). "
        "Start a new chat to go on."
    )
    full = refusal_frame(ContextLengthExceeded("API wording", limit=8192, prompt_tokens=8191))
    assert "no room to answer" in full["message"] and "completion" not in full["message"]
    warming = refusal_frame(
        ServiceUnavailable("API wording", code="model_warming_up", retry_after=5)
    )
    assert (warming["code"], warming["retry_after"]) == ("model_warming_up", 5)
    assert warming["message"].startswith("The model is warming up")
    decision = Decision("tokens", 3000, 10, 5, 60_000, 100, 0, 60_000)
    tokens = refusal_frame(rate_limit_error(decision, tokens=50))
    assert tokens["message"] == "Your organization has reached its limit of tokens per minute."
    assert tokens["retry_after"] == 3.0


@pytest.mark.parametrize(
    "frame",
    [
        {"type": "chat.send", "content": "hi\x00there", "model": "m"},
        {"type": "chat.send", "content": "hi", "model": "m\x00"},
        {"type": "chat.send", "content": "lone \ud800", "model": "m"},
        {"type": "chat.resume", "response_id": "r\x00", "after_seq": 0},
        {"type": "chat.stop", "response_id": "\udfff"},
    ],
)
def test_unstorable_characters_are_refused_in_the_frame(frame):
    """NUL and lone surrogates never reach a lookup: an error frame names the field."""
    with pytest.raises(ProtocolError) as caught:
        parse_command(frame)
    assert caught.value.code == "invalid_message"
    message = caught.value.message
    assert "NUL" in message or "surrogate" in message or "Your message" in message
