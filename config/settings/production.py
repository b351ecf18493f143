"""Production (the default ``DJANGO_ENV``): safe unless told otherwise.

DEBUG off, a required SECRET_KEY (checked by the web and Celery entry
points, config.startup), explicit ALLOWED_HOSTS, secure cookies and HSTS
(TLS is assumed, terminated here or by a proxy), and Redis only with ACL
credentials.
"""

import os
from urllib.parse import urlsplit

from django.core.exceptions import ImproperlyConfigured

from config.settings.base import *  # noqa: F403
from config.settings.base import REDIS_URL, env, tls_settings

DJANGO_ENV = "production"
LOCAL = False

if "DJANGO_ALLOWED_HOSTS" not in os.environ:
    raise ImproperlyConfigured("Set DJANGO_ALLOWED_HOSTS (the hosts this site is served as).")
ALLOWED_HOSTS = env.list("DJANGO_ALLOWED_HOSTS")
if "*" in ALLOWED_HOSTS:
    # A wildcard also lets any Origin through the WebSocket origin check.
    raise ImproperlyConfigured("DJANGO_ALLOWED_HOSTS must not contain '*' outside local mode.")

globals().update(tls_settings(secure=True))

if REDIS_URL and not urlsplit(REDIS_URL).password:
    raise ImproperlyConfigured(
        "Redis needs ACL credentials outside local mode: set REDIS_USERNAME and REDIS_PASSWORD "
        "(docker/redis/README.md), or DJANGO_ENV=local on a development machine."
    )
