"""A console chat socket client (notes ws_protocol.md) for the live topology."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.e2e.flows import MODEL
from tests.e2e.reliability.sse import LONG_STORY

TERMINAL_TYPES = {"completed", "incomplete", "failed", "cancelled"}


class ChatSocket:
    """One /ws/chat/ connection, authenticated by the live user's session cookie."""

    def __init__(self, live):
        from websockets.sync.client import connect

        if live.session_cookie is None:
            pytest.skip("the console app (the chat socket) is not installed")
        origin = live.base_url.removesuffix("/v1")
        connection = connect(
            origin.replace("http://", "ws://") + "/ws/chat/",
            additional_headers={"Cookie": live.session_cookie, "Origin": origin},
            open_timeout=30,
            # Unbounded: a socket the test does not read for a while must
            # keep answering pings, or the client drops it (1011) and the
            # server treats that as an abnormal close.
            max_queue=None,
        )
        # Entered like ``with connect(...)``, without a block: close() ends it.
        self.ws = connection.__enter__()

    def send(self, frame: dict[str, Any]) -> None:
        self.ws.send(json.dumps(frame))

    def recv(self, timeout: float = 60) -> dict[str, Any]:
        return json.loads(self.ws.recv(timeout=timeout))

    def start_story(self) -> str:
        """Send the long prompt in a new conversation; the new response's id."""
        self.send(
            {
                "type": "chat.send",
                "conversation_id": None,
                "content": LONG_STORY[0]["content"],
                "model": MODEL,
            }
        )
        started = self.recv()
        assert started["type"] == "response.started", started
        return started["response_id"]

    def read_until_terminal(self, timeout: float = 60) -> list[dict[str, Any]]:
        frames = []
        while not frames or frames[-1]["type"] not in TERMINAL_TYPES:
            frames.append(self.recv(timeout))
        return frames

    def close(self, code: int = 1000) -> None:
        self.ws.close(code)
