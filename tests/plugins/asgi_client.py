"""A raw ASGI driver for streaming responses and client disconnects."""

from __future__ import annotations

import asyncio
import json
from typing import Any


class ASGIStream:
    """One HTTP exchange with the ASGI app, read incrementally.

    The same path Daphne drives: Django's handler listens for
    ``http.disconnect`` and cancels the response when it arrives.
    """

    def __init__(self, method: str, path: str, headers: dict[str, str], body: bytes):
        from config.asgi import application

        self._body = body
        self._disconnect = asyncio.Event()
        self._chunks: asyncio.Queue[bytes | None] = asyncio.Queue()
        self.status: int | None = None
        self.headers: dict[str, str] = {}
        self._started = asyncio.Event()
        path, _, query = path.partition("?")
        scope = {
            "type": "http",
            "asgi": {"version": "3.0"},
            "http_version": "1.1",
            "method": method,
            "scheme": "http",
            "path": path,
            "raw_path": path.encode(),
            "query_string": query.encode(),
            "root_path": "",
            "server": ("testserver", 80),
            "client": ("127.0.0.1", 5555),
            "headers": [(k.lower().encode(), v.encode()) for k, v in headers.items()],
        }
        self.task = asyncio.get_running_loop().create_task(
            application(scope, self._receive, self._send)
        )

    async def _receive(self) -> dict[str, Any]:
        if self._body is not None:
            body, self._body = self._body, None
            return {"type": "http.request", "body": body, "more_body": False}
        await self._disconnect.wait()
        return {"type": "http.disconnect"}

    async def _send(self, message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            self.status = message["status"]
            self.headers = {k.decode().lower(): v.decode() for k, v in message["headers"]}
            self._started.set()
        elif message["type"] == "http.response.body":
            self._chunks.put_nowait(message.get("body", b""))
            if not message.get("more_body"):
                self._chunks.put_nowait(None)

    async def started(self, timeout: float = 20) -> ASGIStream:
        await asyncio.wait_for(self._started.wait(), timeout)
        return self

    async def read_all(self, timeout: float = 20) -> bytes:
        out = b""
        while (chunk := await asyncio.wait_for(self._chunks.get(), timeout)) is not None:
            out += chunk
        return out

    async def read_until(self, marker: bytes, timeout: float = 20) -> bytes:
        out = b""
        while marker not in out:
            chunk = await asyncio.wait_for(self._chunks.get(), timeout)
            if chunk is None:
                break
            out += chunk
        return out

    async def disconnect(self) -> None:
        self._disconnect.set()
        await asyncio.wait_for(self.task, 10)

    def json(self, body: bytes) -> Any:
        return json.loads(body)


def asgi_post(path: str, key: str, payload: dict[str, Any], **headers: str) -> ASGIStream:
    hdrs = {"authorization": f"Bearer {key}", "content-type": "application/json", **headers}
    return ASGIStream("POST", path, hdrs, json.dumps(payload).encode())


def asgi_get(path: str, key: str, **headers: str) -> ASGIStream:
    return ASGIStream("GET", path, {"authorization": f"Bearer {key}", **headers}, b"")


def sse_events(body: bytes) -> list[tuple[str | None, str]]:
    """(id, data) per SSE event in ``body``; comments skipped."""
    events = []
    for block in body.decode().split("\n\n"):
        event_id, data = None, None
        for line in block.split("\n"):
            if line.startswith("id: "):
                event_id = line[4:]
            elif line.startswith("data: "):
                data = line[6:]
        if data is not None:
            events.append((event_id, data))
    return events


def sdk_client(key: str):
    """The official async SDK talking to the ASGI app in this process."""
    import httpx
    import openai

    from config.asgi import application

    transport = httpx.ASGITransport(app=application)
    return openai.AsyncOpenAI(
        api_key=key,
        base_url="http://testserver/v1",
        max_retries=0,
        http_client=httpx.AsyncClient(transport=transport, base_url="http://testserver"),
    )
