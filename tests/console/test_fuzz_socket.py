"""A fuzz pass over the console's chat socket on PostgreSQL.

Hypothesis draws frames with hostile fields (NUL, lone surrogates, odd
Unicode, huge strings, arbitrary JSON) and raw text that is no JSON at
all. Each frame must be answered by frames of the protocol (an ``error``
frame with a code and a message, or a reply), never by a closed socket;
/healthz, polled meanwhile, must stay responsive, and afterwards the
socket still chats and the database is still up.
"""

from __future__ import annotations

import json

import pytest
from asgiref.sync import sync_to_async
from hypothesis import strategies as st

from fleet.fallback import db_marked_down
from tests.console.sockets import frames_until_end, open_socket
from tests.plugins.hostile import HealthzTimer, draw, json_values, nested_bytes, odd_text
from tests.plugins.request_path import DEMO

pytestmark = [
    pytest.mark.asyncio,
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("close_db_threads"),
]

FRAMES = 60
HEALTHZ_BOUND_S = 2.0
TYPES = ["chat.send", "chat.regenerate", "chat.stop", "chat.resume", "chat.other"]
FIELDS = ["content", "model", "conversation_id", "response_id", "after_seq"]


def frames(count: int, max_huge: int) -> list[str]:
    """Text frames: hostile JSON commands, and text that is not JSON."""
    value = json_values(max_huge) | odd_text(max_huge)
    command = st.builds(
        lambda kind, fields: json.dumps({"type": kind, **fields}),
        st.sampled_from(TYPES),
        st.dictionaries(st.sampled_from(FIELDS), value, max_size=4),
    )
    # A well-formed send whose content is the hostile part.
    send = st.builds(
        lambda content: json.dumps({"type": "chat.send", "content": content, "model": DEMO}),
        odd_text(max_huge),
    )
    anything = st.builds(json.dumps, value)
    # Lone surrogates cannot travel in a text frame (UTF-8): escaped in JSON only.
    raw = odd_text(2_000).map(lambda s: s.encode("utf-8", "replace").decode()).filter(bool)
    drawn = draw(st.one_of(command, send, anything, raw), count)
    return drawn + [nested_bytes(100_000, "list").decode()]


async def answers(socket) -> list[dict]:
    """Every frame sent back until the socket goes quiet; fails if it closed."""
    got = []
    while not await socket.receive_nothing(timeout=0.15, interval=0.01):
        output = await socket.receive_output(timeout=10)
        assert output["type"] == "websocket.send", f"socket closed: {output}"
        got.append(json.loads(output["text"]))
    return got


def assert_protocol_frame(sent: str, frame: dict) -> None:
    assert isinstance(frame.get("type"), str), (sent[:200], frame)
    if frame["type"] == "error":
        assert frame["code"] and frame["message"], (sent[:200], frame)


async def test_fuzzed_frames_get_protocol_answers_and_never_stall(fake_worker, user_factory):
    fake_worker(tokens=2)
    user = await sync_to_async(user_factory)(tier="pro")
    socket = await open_socket(user)
    drawn = await sync_to_async(frames)(FRAMES, max_huge=16_000)
    async with HealthzTimer() as timer:
        for text in drawn:
            await socket.send_to(text_data=text)
            for frame in await answers(socket):
                assert_protocol_frame(text, frame)
    assert timer.worst < HEALTHZ_BOUND_S, f"/healthz took {timer.worst:.2f} s"
    # Still chatting, and the database never marked down.
    await socket.send_json_to({"type": "chat.send", "content": "hi", "model": DEMO})
    started = await socket.receive_json_from(timeout=10)
    assert started["type"] == "response.started", started
    ended = await frames_until_end(socket, started["response_id"])
    assert ended[-1]["type"] == "completed"
    assert not db_marked_down()
    await socket.disconnect()
