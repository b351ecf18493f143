"""The WebSocket origin check: only the site's own pages may open a socket.

Browsers send cookies with a cross-site WebSocket handshake (SameSite=Lax
is the only other guard), so a page on another site could otherwise open
the console's chat as the signed-in user. Channels' AllowedHostsOriginValidator
only asks whether the Origin is one of ALLOWED_HOSTS; this also requires
it to be the host the socket was opened on (as Django's CSRF check does
for POSTs), or one of CSRF_TRUSTED_ORIGINS. No Origin header: refused.
"""

from __future__ import annotations

from urllib.parse import urlsplit

from channels.security.websocket import WebsocketDenier
from django.conf import settings


def _header(scope, name: bytes) -> str | None:
    for key, value in scope.get("headers", []):
        if key == name:
            return value.decode("latin1")
    return None


def origin_allowed(origin: str | None, host: str | None) -> bool:
    """Whether a handshake with this Origin and Host comes from the site itself."""
    if not origin or origin == "null" or not host:
        return False
    if origin in settings.CSRF_TRUSTED_ORIGINS:
        return True
    parts = urlsplit(origin)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        return False
    # Host carries the port when it is not the scheme's default; so does
    # netloc. The scheme is left out: behind a TLS proxy the socket's own
    # scheme is ws even for an https page.
    return parts.netloc.lower() == host.lower()


class SameOriginValidator:
    """ASGI middleware: deny WebSocket handshakes from other origins."""

    def __init__(self, application):
        self.application = application

    async def __call__(self, scope, receive, send):
        if scope["type"] == "websocket" and not origin_allowed(
            _header(scope, b"origin"), _header(scope, b"host")
        ):
            denier = WebsocketDenier()
            return await denier(scope, receive, send)
        return await self.application(scope, receive, send)
