"""Console fixtures: users with sessions, and a paced worker on the in-process bus.

The paced worker is a real participant on the real in-process bus (the one
embedded mode uses), like tests/inference's scripted worker, but it writes
one delta at a time with a pause between them, so a test can stop, drop or
resume a reply while it is being generated. Its heartbeat counts a KV block
per running reply, and aborts free them, as the engine's do.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from http.cookies import SimpleCookie

import pytest
from asgiref.sync import sync_to_async
from channels.testing import WebsocketCommunicator
from django.conf import settings as django_settings
from django.contrib.auth import BACKEND_SESSION_KEY, HASH_SESSION_KEY, SESSION_KEY
from django.contrib.sessions.backends.db import SessionStore

from fleet.selectors import served_model_dir
from tests.inference.conftest import (  # noqa: F401  (fixtures)
    DEMO,
    close_db_threads,
    demo_model,
    memory_bus,
    worker_factory,
)
from tokenization.tokenizer import load_tokenizer
from wire.bus import get_worker_bus
from wire.events import (
    EventType,
    created_event,
    delta_event,
    metrics_body,
    terminal_event,
    usage_body,
)
from wire.requests import GenerationRequest
from wire.workers import WorkerInfo, WorkerState


@dataclass
class _Stream:
    request: GenerationRequest
    seq: int = 1
    sent: int = 0
    due: float = 0.0


@dataclass
class PacedWorker:
    """Answers each request with ``tokens`` deltas ``interval`` seconds apart."""

    tokens: int = 8
    interval: float = 0.05
    model: str = DEMO
    worker_id: str = "paced-worker"
    received: list[GenerationRequest] = field(default_factory=list)
    aborted: list[str] = field(default_factory=list)
    _streams: dict[str, _Stream] = field(default_factory=dict)
    _stop: threading.Event = field(default_factory=threading.Event)

    def start(self) -> PacedWorker:
        self.bus = get_worker_bus()
        self.bus.register(self.info())
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self.thread.join(5)
        self.bus.deregister(self.worker_id)

    def info(self) -> WorkerInfo:
        return WorkerInfo(
            worker_id=self.worker_id,
            model=self.model,
            state=WorkerState.READY,
            running=len(self._streams),
            kv_blocks_used=len(self._streams),
            kv_blocks_total=64,
        )

    def _run(self) -> None:
        beat = 0.0
        while not self._stop.is_set():
            if time.monotonic() - beat > 0.2:
                self.bus.heartbeat(self.info())
                beat = time.monotonic()
            requests, aborts = self.bus.poll(self.worker_id, 10)
            for request in requests:
                self.received.append(request)
                rid = request.response_id
                prompt = len(request.prompt_token_ids)
                event = created_event(
                    response_id=rid,
                    model=self.model,
                    worker_id=self.worker_id,
                    prompt_tokens=prompt,
                )
                self.bus.publish(rid, event)
                self._streams[rid] = _Stream(request, due=time.monotonic())
            for rid in aborts:
                self.aborted.append(rid)
                stream = self._streams.pop(rid, None)
                if stream is not None:
                    self._end(stream, EventType.CANCELLED, "abort")
            now = time.monotonic()
            for rid, stream in list(self._streams.items()):
                if now < stream.due:
                    continue
                stream.seq += 1
                stream.sent += 1
                last = stream.sent == self.tokens
                choice = {
                    "index": 0,
                    "text": f"w{stream.sent} ",
                    "token_ids": [100 + stream.sent],
                    "logprobs": None,
                    "finish_reason": "length" if last else None,
                }
                self.bus.publish(rid, delta_event(stream.seq, [choice]))
                stream.due = now + self.interval
                if last:
                    del self._streams[rid]
                    self._end(stream, EventType.COMPLETED, "length")

    def _end(self, stream: _Stream, kind: EventType, reason: str) -> None:
        prompt = len(stream.request.prompt_token_ids)
        usage = usage_body(prompt_tokens=prompt, completion_tokens=stream.sent)
        metrics = metrics_body(queue_time_ms=1.0, ttft_ms=12.0, duration_ms=50.0)
        event = terminal_event(
            kind, stream.seq + 1, usage=usage, metrics=metrics, finish_reasons={"0": reason}
        )
        self.bus.publish(stream.request.response_id, event)


@pytest.fixture
def paced_worker(memory_bus, demo_model):  # noqa: F811
    # Load the tokenizer before the clock of a socket read starts: the first
    # load takes seconds on a busy machine.
    load_tokenizer(str(served_model_dir(model=demo_model)))
    started: list[PacedWorker] = []

    def make(**kwargs) -> PacedWorker:
        worker = PacedWorker(**kwargs).start()
        started.append(worker)
        return worker

    yield make
    for worker in started:
        worker.stop()


def _session_cookie(user) -> str:
    store = SessionStore()
    store[SESSION_KEY] = str(user.pk)
    store[BACKEND_SESSION_KEY] = "django.contrib.auth.backends.ModelBackend"
    store[HASH_SESSION_KEY] = user.get_session_auth_hash()
    store.save()
    cookie = SimpleCookie()
    cookie[django_settings.SESSION_COOKIE_NAME] = store.session_key
    return cookie.output(header="", attrs=[]).strip()


async def open_socket(user=None, *, expect_accept: bool = True) -> WebsocketCommunicator:
    """A socket to /ws/chat/ through the real ASGI stack, signed in as ``user``."""
    from config.asgi import application

    headers = [(b"origin", b"http://testserver"), (b"host", b"testserver")]
    if user is not None:
        cookie = await sync_to_async(_session_cookie)(user)
        headers.append((b"cookie", cookie.encode()))
    communicator = WebsocketCommunicator(application, "/ws/chat/", headers=headers)
    connected, code = await communicator.connect()
    if expect_accept:
        assert connected, f"socket refused with {code}"
    else:
        communicator.close_code = code
        communicator.was_accepted = connected
    return communicator


async def frames_until_end(communicator, response_id: str, timeout: float = 10) -> list[dict]:
    """Frames up to and including the reply's terminal one."""
    frames = []
    while True:
        frame = await communicator.receive_json_from(timeout=timeout)
        frames.append(frame)
        terminal = frame["type"] in ("completed", "incomplete", "failed", "cancelled")
        if terminal and frame.get("response_id") == response_id:
            return frames
