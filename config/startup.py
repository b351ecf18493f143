"""Start-up of the web and Celery processes: the secret key check, the web's metrics port.

Settings give SECRET_KEY no fallback; Django would only complain at the
first signed cookie. The web (``config.asgi``) and Celery
(``config.celery_app``) call ``require_secret_key`` as they start, so a
missing key stops them at once. GPU workers sign nothing and never get it.
"""

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured


def require_secret_key() -> None:
    try:
        key = settings.SECRET_KEY
    except ImproperlyConfigured:
        key = ""
    if not key:
        raise ImproperlyConfigured(
            "Set DJANGO_SECRET_KEY: a long random string, e.g. "
            "python -c 'import secrets; print(secrets.token_urlsafe(50))'."
        )


def metrics_port_start() -> int | None:
    """Serve this process's Prometheus series on WEB_METRICS_PORT (0: none).

    Beside the main port's /metrics (behind METRICS_TOKEN): plain HTTP, for
    a scraper on a private network that addresses each replica by IP.
    Returns the port, or None when off.
    """
    port = settings.WEB_METRICS_PORT
    if not port:
        return None
    from prometheus_client import start_http_server

    server, _ = start_http_server(port, addr=settings.WEB_METRICS_HOST)
    return server.server_address[1]
