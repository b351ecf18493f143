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

from inference.routing import websocket_urlpatterns  # noqa: E402

if settings.EMBEDDED_ENGINE:
    # Start loading and warming the in-process engine with the server, not
    # on the first request, so the first chat does not wait for it.
    from gpuworkers.embedded import ensure_started  # noqa: E402

    ensure_started()

application = ProtocolTypeRouter(
    {
        # The console's few CSS/JS files, served without blocking the loop.
        "http": ASGIStaticFilesHandler(django_asgi_app),
        "websocket": AllowedHostsOriginValidator(
            AuthMiddlewareStack(URLRouter(websocket_urlpatterns))
        ),
    }
)
