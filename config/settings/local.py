"""Local mode (``DJANGO_ENV=local``: ``bin/run``, the tests): what a laptop
needs relaxed. Loopback hosts, cookies over plain HTTP, no HSTS, Redis
without credentials. DEBUG stays off unless ``DJANGO_DEBUG`` turns it on
(``bin/run`` does).
"""

from config.settings.base import *  # noqa: F403
from config.settings.base import env, tls_settings

DJANGO_ENV = "local"
LOCAL = True

ALLOWED_HOSTS = env.list("DJANGO_ALLOWED_HOSTS", default=["localhost", "127.0.0.1", "[::1]"])

globals().update(tls_settings(secure=False))
