"""Probes for orchestrators and load balancers: /healthz and /readyz."""

from django.http import HttpRequest, JsonResponse

from config.health import readiness


async def healthz(request: HttpRequest) -> JsonResponse:
    """Liveness: the process answers."""
    return JsonResponse({"status": "ok"})


async def readyz(request: HttpRequest) -> JsonResponse:
    """Readiness: 200 when this process can serve a completion, else 503 and why."""
    result = await readiness()
    body = {"status": "ready" if result.ready else "not ready", "checks": result.checks}
    response = JsonResponse(body, status=200 if result.ready else 503)
    # A probe that says "not ready" every few seconds is not a server error
    # to log each time (Django logs every 5xx unless told it was logged).
    response._has_been_logged = True
    return response
