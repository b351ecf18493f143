"""Reads for the request path: where a response's events are.

The served-model catalog is the fleet's (``fleet.selectors``).
"""

import re

from django.core.cache import cache

from inference.relay.tap import ResponseRoute, route_cache_key

# The ids this server issues ("chatcmpl-<hex>", "resp-<hex>"): anything
# else is unknown without a lookup, and never becomes part of a cache key.
_RESPONSE_ID = re.compile(r"[A-Za-z0-9_.:\-]{1,128}")


async def response_route_get(*, response_id: str, tenant_id: int) -> ResponseRoute | None:
    """The route of ``response_id`` if it belongs to the tenant, else None.

    Another tenant's response is indistinguishable from an unknown or
    expired one.
    """
    if not _RESPONSE_ID.fullmatch(response_id):
        return None
    route = await cache.aget(route_cache_key(response_id))
    # Anything else under the key (a route an older release cached as a dict)
    # cannot be resumed, as if expired.
    if not isinstance(route, ResponseRoute) or route.tenant_id != tenant_id:
        return None
    return route
