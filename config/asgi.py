"""ASGI entry point for Daphne: HTTP (API, SSE, console, admin) and WebSockets."""

import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
# Django must be set up before anything imports models.
django_asgi_app = get_asgi_application()

from channels.auth import AuthMiddlewareStack  # noqa: E402
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from channels.security.websocket import AllowedHostsOriginValidator  # noqa: E402
from django.conf import settings  # noqa: E402
from django.contrib.staticfiles.handlers import ASGIStaticFilesHandler  # noqa: E402

from config.proxies import TrustedProxyMiddleware  # noqa: E402
from config.startup import require_secret_key  # noqa: E402
from config.websocket import SameOriginValidator  # noqa: E402
from console.routing import websocket_urlpatterns  # noqa: E402
from wire.tracing import tracing_configure  # noqa: E402

# Sessions and CSRF tokens are signed: no key, no web process.
require_secret_key()

# Spans go where the OTEL_* environment says; off when it says nothing.
tracing_configure(service_name="llm-platform-web")

# The safety classifier takes seconds to load (scikit-learn): load it with
# the server, not on the first request that needs it.
from safety.checks.classifier import warm_in_background  # noqa: E402

warm_in_background()

if settings.WEB_WARM_TOKENIZERS:
    # Prompts are tokenized here; the first burst must not wait for the load.
    from inference.prompts.warmup import tokenizers_warm_in_background  # noqa: E402

    tokenizers_warm_in_background()

if settings.EMBEDDED_ENGINE:
    # Start loading and warming the in-process engine with the server, not
    # on the first request, so the first chat does not wait for it.
    from config.embedded import start  # noqa: E402

    start()

if settings.USAGE_SETTLER_IN_PROCESS:
    # No Celery beat settles usage in this mode: a thread of this process does.
    from config import settler  # noqa: E402

    settler.start()

if settings.BATCHES_IN_PROCESS:
    # Nor does it sweep batches (expiry, resuming after a restart).
    from batches.tasks import sweeper_start  # noqa: E402

    sweeper_start()

# Prometheus' own port, when WEB_METRICS_PORT is set (docker/compose.yaml).
from config.startup import metrics_port_start  # noqa: E402

metrics_port_start()

# Under Daphne, SIGTERM drains open responses before the process stops.
from config import shutdown  # noqa: E402

shutdown.install()

application = TrustedProxyMiddleware(
    ProtocolTypeRouter(
        {
            # The console's few CSS/JS files, served without blocking the loop.
            "http": ASGIStaticFilesHandler(django_asgi_app),
            # A handshake must name an allowed host and come from a page of
            # the site itself (cross-site WebSocket hijacking).
            "websocket": AllowedHostsOriginValidator(
                SameOriginValidator(AuthMiddlewareStack(URLRouter(websocket_urlpatterns)))
            ),
        }
    ),
    # The client's address (login throttling, the audit log) comes from
    # X-Forwarded-For only when these proxies send it.
    trusted=settings.TRUSTED_PROXIES,
)
