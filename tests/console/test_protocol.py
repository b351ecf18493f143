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
from inference.errors import InsufficientQuota, RateLimited
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
