"""API-key authentication for the OpenAI-compatible API.

Keys arrive as ``Authorization: Bearer <key>``. Missing, malformed, unknown
and revoked keys all get the same 401 ``invalid_api_key`` (ninja's own
AuthenticationError for a missing header is mapped to it in errors.py); a
valid key whose tier has no API access gets 403.
"""

from asgiref.sync import sync_to_async
from django.http import HttpRequest
from ninja.security import HttpBearer

from inference.errors import AuthenticationFailed, PermissionDenied
from tenants.models import ApiKey
from tenants.selectors import api_key_authenticate
from tenants.services import api_key_touch


def _mask(raw_key: str) -> str:
    # Enough to recognise a key in the message, never enough to use it.
    return raw_key[:10] + "…" if len(raw_key) > 14 else "…"


class ApiKeyAuth(HttpBearer):
    async def authenticate(self, request: HttpRequest, token: str) -> ApiKey:
        api_key = await sync_to_async(api_key_authenticate)(raw_key=token)
        if api_key is None:
            raise AuthenticationFailed(f"Incorrect API key provided: {_mask(token)}.")
        tier = api_key.tenant.tier
        if not tier.api_access:
            raise PermissionDenied(
                f"The {tier.name} tier has no API access; use the web console or upgrade.",
                code="api_access_denied",
            )
        await sync_to_async(api_key_touch)(api_key=api_key)
        return api_key


api_key_auth = ApiKeyAuth()
