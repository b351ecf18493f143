"""The client's address behind trusted proxies (``TRUSTED_PROXIES``).

Daphne's ``--proxy-headers`` takes ``X-Forwarded-For`` from any peer, so
any client could name its own address to login throttling (django-axes)
and the audit log. This ASGI middleware rewrites ``scope["client"]`` (from
which Django sets ``REMOTE_ADDR``, for HTTP and WebSocket alike) only when
the direct peer is inside one of the trusted networks, and then to the
right-most address of ``X-Forwarded-For`` that is not itself a trusted
proxy: the one the outermost trusted proxy saw connect. Anything left of
it was written by the client and is ignored. Uvicorn's ProxyHeaders
middleware works the same way; Daphne has no list of trusted proxies.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable

from django.core.exceptions import ImproperlyConfigured

Network = ipaddress.IPv4Network | ipaddress.IPv6Network


def trusted_networks(cidrs: Iterable[str]) -> tuple[Network, ...]:
    """The networks ``cidrs`` name (a bare address is a /32 or /128)."""
    networks = []
    for cidr in cidrs:
        try:
            networks.append(ipaddress.ip_network(cidr.strip(), strict=False))
        except ValueError as exc:
            raise ImproperlyConfigured(f"TRUSTED_PROXIES: {cidr!r} is not a CIDR: {exc}") from exc
    return tuple(networks)


def _trusted(address: str, networks: tuple[Network, ...]) -> bool:
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return False
    return any(ip in network for network in networks)


def client_address(peer: str, forwarded_for: str | None, networks: tuple[Network, ...]) -> str:
    """The client's address, given the direct peer and its X-Forwarded-For."""
    if not forwarded_for or not _trusted(peer, networks):
        return peer
    hops = [hop.strip() for hop in forwarded_for.split(",") if hop.strip()]
    for hop in reversed(hops):
        if not _trusted(hop, networks):
            # Not a valid address: the proxy chain is garbled, trust none of it.
            return hop if _valid(hop) else peer
    # Every hop a trusted proxy: the first one is the furthest we know of.
    return hops[0] if hops else peer


def _valid(address: str) -> bool:
    try:
        ipaddress.ip_address(address)
    except ValueError:
        return False
    return True


class TrustedProxyMiddleware:
    """ASGI middleware: ``scope["client"]`` from X-Forwarded-For of trusted peers only."""

    def __init__(self, app, *, trusted: Iterable[str]) -> None:
        self.app = app
        self.networks = trusted_networks(trusted)

    async def __call__(self, scope, receive, send):
        client = scope.get("client")
        if self.networks and scope["type"] in ("http", "websocket") and client:
            forwarded = [v for k, v in scope.get("headers", ()) if k == b"x-forwarded-for"]
            if forwarded:
                # Several headers are one list, in order (RFC 9110, 5.3).
                value = b",".join(forwarded).decode("latin-1")
                address = client_address(client[0], value, self.networks)
                if address != client[0]:
                    scope = dict(scope, client=(address, 0))
        return await self.app(scope, receive, send)
