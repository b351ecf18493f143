"""The audit log's actor: the signed-in user of the request making a change.

django-auditlog's own middleware is sync-only (every async SSE view would be
pushed through a thread) and takes the client address from
X-Forwarded-For, which any client can set. This one runs in both modes,
skips the API (keys, not users, act there) and records REMOTE_ADDR, which
config.proxies takes from X-Forwarded-For of a trusted proxy only.
"""

from __future__ import annotations

from asgiref.sync import iscoroutinefunction, markcoroutinefunction
from auditlog.context import set_actor

# Paths whose requests never change audited rows as a user.
_SKIPPED = ("/v1/", "/static/", "/metrics", "/healthz", "/readyz")


class AuditActorMiddleware:
    sync_capable = True
    async_capable = True

    def __init__(self, get_response):
        self.get_response = get_response
        if iscoroutinefunction(get_response):
            markcoroutinefunction(self)

    def __call__(self, request):
        if iscoroutinefunction(self):
            return self._acall(request)
        if request.path.startswith(_SKIPPED) or not request.user.is_authenticated:
            return self.get_response(request)
        with set_actor(request.user, remote_addr=request.META.get("REMOTE_ADDR")):
            return self.get_response(request)

    async def _acall(self, request):
        if request.path.startswith(_SKIPPED):
            return await self.get_response(request)
        user = await request.auser()
        if not user.is_authenticated:
            return await self.get_response(request)
        # The context variable follows the view into its sync_to_async thread.
        with set_actor(user, remote_addr=request.META.get("REMOTE_ADDR")):
            return await self.get_response(request)
