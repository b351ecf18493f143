"""The settings environment of a test run, loaded before Django (``-p`` in
pyproject's addopts: pytest-django reads the settings before any conftest).

Settings are production-safe by default; the tests run in local mode
(loopback hosts, cookies over plain HTTP, Redis without ACL credentials)
with a secret made for this run. Subprocesses the tests start (Daphne,
gpuworkers, Celery) inherit it. Tests of the production defaults build their
own environment (tests/config/test_settings.py).
"""

import os
import secrets

os.environ.setdefault("DJANGO_ENV", "local")
os.environ.setdefault("DJANGO_SECRET_KEY", "test-" + secrets.token_urlsafe(50))
# The in-process ASGI app must not query the database from a thread of its
# own at import (inference.prompts.warmup); tests/inference/test_warmup.py calls it.
os.environ.setdefault("WEB_WARM_TOKENIZERS", "0")
