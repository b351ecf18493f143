"""The chat socket refuses handshakes from other sites (cross-site WebSocket hijacking)."""

import pytest
from asgiref.sync import sync_to_async
from channels.testing import WebsocketCommunicator

from config.websocket import origin_allowed
from tests.console.sockets import _session_cookie

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio]


async def handshake(user, origin: bytes | None, host: bytes = b"testserver") -> bool:
    from config.asgi import application

    headers = [(b"host", host)]
    if origin is not None:
        headers.append((b"origin", origin))
    cookie = await sync_to_async(_session_cookie)(user)
    headers.append((b"cookie", cookie.encode()))
    communicator = WebsocketCommunicator(application, "/ws/chat/", headers=headers)
    connected, _ = await communicator.connect()
    await communicator.disconnect()
    return connected


@pytest.fixture
def member(user_factory, demo_model):
    return user_factory()


async def test_a_signed_in_users_socket_from_another_site_is_refused(member):
    """The victim's session cookie rides along; the Origin gives the page away."""
    assert await handshake(member, b"http://testserver")
    assert not await handshake(member, b"https://evil.example")
    # An allowed host is not enough: it must be the host the socket is for.
    assert not await handshake(member, b"http://localhost", host=b"testserver")
    assert not await handshake(member, None)
    assert not await handshake(member, b"null")


def test_origin_rules(settings):
    settings.CSRF_TRUSTED_ORIGINS = ["https://console.example.com"]
    assert origin_allowed("https://llm.example.com", "llm.example.com")
    assert origin_allowed("https://llm.example.com:8443", "llm.example.com:8443")
    assert not origin_allowed("https://llm.example.com:8443", "llm.example.com")
    assert not origin_allowed("https://llm.example.com.evil.io", "llm.example.com")
    assert origin_allowed("https://console.example.com", "llm.example.com")
    assert not origin_allowed("ftp://llm.example.com", "llm.example.com")
