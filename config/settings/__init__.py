"""Settings, cookiecutter-style: ``base`` (shared), ``local``, ``production``
and ``test`` (pytest's, pyproject.toml).

``DJANGO_SETTINGS_MODULE`` may name one of them. The short name
``config.settings``, which manage.py, Daphne, Celery, the Docker image and
the test subprocesses set, picks ``local`` or ``production`` from
``DJANGO_ENV`` (production unless told otherwise), so every entry point that
knew one settings module keeps working. A module named explicitly is not
second-guessed: this package then only holds it.
"""

import os

from django.core.exceptions import ImproperlyConfigured

if os.environ.get("DJANGO_SETTINGS_MODULE", __name__) == __name__:
    _ENV = os.environ.get("DJANGO_ENV") or "production"
    if _ENV == "production":
        from config.settings.production import *  # noqa: F403
    elif _ENV == "local":
        from config.settings.local import *  # noqa: F403
    else:
        raise ImproperlyConfigured(f"DJANGO_ENV must be production or local, not {_ENV!r}")
