"""Client addresses behind trusted proxies only (config.proxies, TRUSTED_PROXIES).

X-Forwarded-For from a peer outside TRUSTED_PROXIES is ignored, so a
client cannot pick the address login throttling and the audit log see;
from a trusted proxy, the right-most untrusted address is the client.
"""

from __future__ import annotations

import re
from http.cookies import SimpleCookie
from urllib.parse import urlencode

import pytest
from asgiref.sync import async_to_sync
from asgiref.testing import ApplicationCommunicator
from django.core.asgi import get_asgi_application
from django.core.exceptions import ImproperlyConfigured

from config.proxies import TrustedProxyMiddleware, client_address, trusted_networks

CADDY = "172.18.0.5"
PRIVATE = ["10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "fc00::/7"]
NETWORKS = trusted_networks(PRIVATE)


@pytest.mark.parametrize(
    ("peer", "forwarded", "client"),
    [
        # An untrusted peer's header is ignored, whatever it says.
        ("203.0.113.9", "198.51.100.1", "203.0.113.9"),
        ("203.0.113.9", "10.0.0.1, 172.18.0.5", "203.0.113.9"),
        # Caddy forwarding a client: the client.
        (CADDY, "203.0.113.9", "203.0.113.9"),
        # A client's own header in front of Caddy's: the right-most untrusted wins.
        (CADDY, "1.2.3.4, 203.0.113.9", "203.0.113.9"),
        # Through an outer private proxy too.
        (CADDY, "1.2.3.4, 203.0.113.9, 10.1.2.3", "203.0.113.9"),
        # A client inside the private network: every hop trusted, the first.
        (CADDY, "10.9.8.7", "10.9.8.7"),
        # Garbage where the client should be: the peer, nothing invented.
        (CADDY, "1.2.3.4, not-an-address", CADDY),
        (CADDY, "", CADDY),
        ("2001:db8::1", "198.51.100.1", "2001:db8::1"),
        ("fd00::2", "2001:db8::7", "2001:db8::7"),
    ],
)
def test_the_client_is_the_right_most_untrusted_hop_of_a_trusted_peer(peer, forwarded, client):
    assert client_address(peer, forwarded, NETWORKS) == client


def test_a_bad_cidr_is_a_configuration_error():
    with pytest.raises(ImproperlyConfigured, match="TRUSTED_PROXIES"):
        trusted_networks(["10.0.0.0/8", "caddy"])


def _seen_client(trusted: list[str], scope_type: str, peer: str, forwarded: list[bytes]):
    seen = {}

    async def app(scope, receive, send):
        seen["client"] = scope["client"]

    scope = {
        "type": scope_type,
        "path": "/",
        "client": (peer, 40000),
        "headers": [(b"x-forwarded-for", value) for value in forwarded],
    }
    async_to_sync(TrustedProxyMiddleware(app, trusted=trusted))(scope, None, None)
    return seen["client"][0]


@pytest.mark.parametrize("scope_type", ["http", "websocket"])
def test_the_middleware_rewrites_the_scope_for_trusted_peers_only(scope_type):
    spoof = [b"198.51.100.1"]
    assert _seen_client(PRIVATE, scope_type, "203.0.113.9", spoof) == "203.0.113.9"
    assert _seen_client(PRIVATE, scope_type, CADDY, spoof) == "198.51.100.1"
    # Two headers are one list: the right-most untrusted address of both.
    assert _seen_client(PRIVATE, scope_type, CADDY, [b"1.1.1.1", b"2.2.2.2"]) == "2.2.2.2"
    # No trusted proxies (the default): nobody's header counts.
    assert _seen_client([], scope_type, CADDY, spoof) == CADDY


# Login throttling through the real ASGI stack: Django's handler sets
# REMOTE_ADDR from the scope this middleware wrote, and django-axes keys
# failures on it. transaction=True: the handler's views run on a database
# connection of their own, which must see the committed user.

PASSWORD = "right-password-1"


class Browser:
    """One client's cookies and CSRF token, over raw ASGI requests."""

    def __init__(self, app, peer: str) -> None:
        self.app, self.peer, self.cookies = app, peer, SimpleCookie()

    def request(self, method: str, path: str, *, forwarded: str = "", body: bytes = b""):
        headers = [(b"host", b"testserver")]
        if self.cookies:
            cookie = "; ".join(f"{k}={v.value}" for k, v in self.cookies.items())
            headers.append((b"cookie", cookie.encode()))
        if forwarded:
            headers.append((b"x-forwarded-for", forwarded.encode()))
        if body:
            headers.append((b"content-type", b"application/x-www-form-urlencoded"))
        scope = {
            "type": "http",
            "asgi": {"version": "3.0"},
            "http_version": "1.1",
            "method": method,
            "scheme": "http",
            "path": path,
            "raw_path": path.encode(),
            "query_string": b"",
            "root_path": "",
            "headers": headers,
            "client": (self.peer, 50000),
            "server": ("testserver", 80),
        }
        return async_to_sync(self._send)(scope, body)

    async def _send(self, scope, body: bytes) -> tuple[int, str]:
        communicator = ApplicationCommunicator(self.app, scope)
        await communicator.send_input({"type": "http.request", "body": body})
        start = await communicator.receive_output(30)
        for name, value in start["headers"]:
            if name.lower() == b"set-cookie":
                self.cookies.load(value.decode())
        chunks = []
        while True:
            message = await communicator.receive_output(30)
            chunks.append(message.get("body", b""))
            if not message.get("more_body"):
                break
        return start["status"], b"".join(chunks).decode()

    def login(self, username: str, password: str, forwarded: str = "") -> int:
        _, page = self.request("GET", "/accounts/login/", forwarded=forwarded)
        token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page).group(1)
        form = {"username": username, "password": password, "csrfmiddlewaretoken": token}
        status, _ = self.request(
            "POST", "/accounts/login/", forwarded=forwarded, body=urlencode(form).encode()
        )
        return status


@pytest.mark.django_db(transaction=True)
def test_a_spoofed_forwarded_for_from_an_untrusted_peer_does_not_dodge_the_lockout(
    user_factory, settings
):
    """An attacker rotating X-Forwarded-For from one address is still one
    address to django-axes: locked out after AXES_FAILURE_LIMIT failures."""
    user_factory(username="target", password=PASSWORD)
    browser = Browser(
        TrustedProxyMiddleware(get_asgi_application(), trusted=PRIVATE), "203.0.113.9"
    )
    statuses = [
        browser.login("target", "guess", forwarded=f"198.51.100.{n}")
        for n in range(settings.AXES_FAILURE_LIMIT)
    ]
    assert statuses[:-1] == [200] * (settings.AXES_FAILURE_LIMIT - 1)
    assert statuses[-1] == 429
    assert browser.login("target", PASSWORD, forwarded="198.51.100.200") == 429


@pytest.mark.django_db(transaction=True)
def test_a_trusted_proxys_forwarded_for_names_the_client(user_factory, settings):
    """Behind Caddy (a trusted peer), each client is its own address: one
    client's lockout does not lock another coming through the same proxy."""
    user_factory(username="target", password=PASSWORD)
    app = TrustedProxyMiddleware(get_asgi_application(), trusted=PRIVATE)
    attacker, victim = Browser(app, CADDY), Browser(app, CADDY)
    for _ in range(settings.AXES_FAILURE_LIMIT):
        attacker.login("target", "guess", forwarded="203.0.113.66")
    assert attacker.login("target", PASSWORD, forwarded="203.0.113.66") == 429
    assert victim.login("target", PASSWORD, forwarded="198.51.100.7") == 302


def test_trusted_proxies_come_from_the_environment_and_default_to_none():
    from tests.config.test_settings import PRODUCTION, run

    show = "import django; django.setup(); from django.conf import settings as s; "
    show += "print(s.TRUSTED_PROXIES)"
    bare = run(["-c", show], PRODUCTION)
    assert bare.returncode == 0, bare.stderr[-2000:]
    assert bare.stdout.strip().splitlines()[-1] == "[]"
    env = {**PRODUCTION, "TRUSTED_PROXIES": "10.0.0.0/8,fc00::/7"}
    listed = run(["-c", show], env)
    assert listed.stdout.strip().splitlines()[-1] == "['10.0.0.0/8', 'fc00::/7']"
