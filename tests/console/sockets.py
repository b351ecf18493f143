"""The console's chat socket in tests: a signed-in session and its frames."""

from __future__ import annotations

from http.cookies import SimpleCookie

from asgiref.sync import sync_to_async
from channels.testing import WebsocketCommunicator
from django.conf import settings as django_settings
from django.contrib.auth import BACKEND_SESSION_KEY, HASH_SESSION_KEY, SESSION_KEY
from django.contrib.sessions.backends.db import SessionStore


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
    return await open_socket_at("/ws/chat/", user, expect_accept=expect_accept)


async def open_socket_at(
    path: str, user=None, *, expect_accept: bool = True
) -> WebsocketCommunicator:
    """A socket to ``path`` through the real ASGI stack, signed in as ``user``."""
    from config.asgi import application

    headers = [(b"origin", b"http://testserver"), (b"host", b"testserver")]
    if user is not None:
        cookie = await sync_to_async(_session_cookie)(user)
        headers.append((b"cookie", cookie.encode()))
    communicator = WebsocketCommunicator(application, path, headers=headers)
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
