"""Reads for the request path: where a response's events are.

The served-model catalog is the fleet's (``fleet.selectors``).
"""

from django.core.cache import cache

from inference.relay.tap import ResponseRoute, route_cache_key


async def response_route_get(*, response_id: str, tenant_id: int) -> ResponseRoute | None:
    """The route of ``response_id`` if it belongs to the tenant, else None.

    Another tenant's response is indistinguishable from an unknown or
    expired one.
    """
    route = await cache.aget(route_cache_key(response_id))
    # Anything else under the key (a route an older release cached as a dict)
    # cannot be resumed, as if expired.
    if not isinstance(route, ResponseRoute) or route.tenant_id != tenant_id:
        return None
    return route
