"""Probes for orchestrators and load balancers (/healthz, /readyz) and /metrics."""

import hmac

from django.conf import settings
from django.http import HttpRequest, HttpResponse, JsonResponse
from django_prometheus.exports import ExportToDjangoView

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


def metrics(request: HttpRequest) -> HttpResponse:
    """Prometheus' scrape (django-prometheus' exposition), behind METRICS_TOKEN.

    Sync: generating the exposition is CPU work, kept off the event loop.
    """
    token = settings.METRICS_TOKEN
    if not token:
        if settings.LOCAL:
            return ExportToDjangoView(request)
        return HttpResponse(
            "Metrics are off: set METRICS_TOKEN and scrape with it as a bearer token.\n",
            status=403,
            content_type="text/plain",
        )
    sent = request.headers.get("Authorization", "")
    scheme, _, credentials = sent.partition(" ")
    if scheme.lower() != "bearer" or not hmac.compare_digest(
        credentials.strip().encode(), token.encode()
    ):
        response = HttpResponse("A valid bearer token is required.\n", status=401)
        response["WWW-Authenticate"] = 'Bearer realm="metrics"'
        return response
    return ExportToDjangoView(request)
