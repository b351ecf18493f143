"""API-key authentication for the OpenAI-compatible API.

Keys arrive as ``Authorization: Bearer <key>``. Missing, malformed, unknown
and revoked keys all get the same 401 ``invalid_api_key`` (ninja's own
AuthenticationError for a missing header is mapped to it in errors.py); a
valid key whose tier has no API access gets 403.
"""

from asgiref.sync import sync_to_async
from django.db import DataError
from django.http import HttpRequest
from ninja.security import HttpBearer

from fleet.fallback import (
    DB_UNREACHABLE,
    KeyUnverifiable,
    auth_cache_authenticate,
    auth_cache_forget,
    auth_cache_remember,
    db_mark_down,
    db_marked_down,
)
from inference.errors import AuthenticationFailed, PermissionDenied, ServiceUnavailable
from tenants.models import ApiKey
from tenants.selectors import api_key_authenticate
from tenants.services import api_key_touch, api_key_touch_due
from wire.tracing import tracer


def _mask(raw_key: str) -> str:
    # Enough to recognise a key in the message, never enough to use it.
    return raw_key[:10] + "…" if len(raw_key) > 14 else "…"


class ApiKeyAuth(HttpBearer):
    async def authenticate(self, request: HttpRequest, token: str) -> ApiKey:
        with tracer.start_as_current_span("auth"):
            return await self._authenticate(token)

    async def _authenticate(self, token: str) -> ApiKey:
        api_key = await _authenticate(token)
        if api_key is None:
            raise AuthenticationFailed(f"Incorrect API key provided: {_mask(token)}.")
        tier = api_key.tenant.tier
        if not tier.api_access:
            raise PermissionDenied(
                f"The {tier.name} tier has no API access; use the web console or upgrade.",
                code="api_access_denied",
            )
        # Once a minute at most: skipped without a query (or a thread hop)
        # while the key as just loaded says it was used recently.
        if api_key_touch_due(api_key=api_key) and not db_marked_down():
            try:
                await sync_to_async(api_key_touch)(api_key=api_key)
            except DB_UNREACHABLE:
                db_mark_down()
        return api_key


async def _authenticate(token: str) -> ApiKey | None:
    """The database's answer; with PostgreSQL down, the recent-success cache's."""
    if not db_marked_down():
        try:
            return await sync_to_async(_authenticate_in_db)(token)
        except DataError:
            # A token no key row could hold (a NUL byte): no such key.
            return None
        except DB_UNREACHABLE:
            db_mark_down()
    try:
        return await sync_to_async(auth_cache_authenticate)(raw_key=token)
    except KeyUnverifiable as exc:
        # A busy pool or an outage: the key may well be valid, so retryable.
        raise ServiceUnavailable(
            "API keys cannot be verified right now; retry shortly.",
            code="database_unavailable",
            headers={"Retry-After": "5"},
        ) from exc


def _authenticate_in_db(token: str) -> ApiKey | None:
    """The key's lookup and the fallback cache's update, in one thread hop
    (each hop is a wait on the request's way to its first token)."""
    api_key = api_key_authenticate(raw_key=token)
    if api_key is None:
        auth_cache_forget(raw_key=token)
    else:
        auth_cache_remember(api_key=api_key)
    return api_key


api_key_auth = ApiKeyAuth()
