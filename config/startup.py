"""Start-up checks of the processes that sign things: Daphne and Celery.

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
