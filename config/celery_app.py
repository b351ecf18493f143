"""The Celery application: billing (invoices, roll-ups, budgets, reports), fleet and batch tasks.

Configuration comes from Django settings (``CELERY_*``): broker and result
backend on Redis, late acks, the queue routes and the beat schedule. Run a
worker with ``celery -A config.celery_app worker -Q billing,fleet,batches`` and the
scheduler with ``celery -A config.celery_app beat``.

Task metrics come from ``config.celery_metrics`` (``CELERY_METRICS_PORT``);
log lines are the platform's (Django's LOGGING, JSON by default), not
Celery's own format.
"""

import os

from celery import Celery, signals

from config import celery_metrics  # noqa: F401 (connects the task signals)

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")

# The Django task class gives every task delay_on_commit / apply_async_on_commit.
app = Celery("config", task_cls="celery.contrib.django.task:DjangoTask")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()


@signals.worker_init.connect(weak=False)
@signals.beat_init.connect(weak=False)
def _require_secret_key(**_kwargs) -> None:
    # Celery runs the web's code (emails with links, reports): without the
    # key it is as misconfigured as the web. SystemExit, because Celery logs
    # and swallows a signal handler's ordinary exceptions.
    from django.core.exceptions import ImproperlyConfigured

    from config.startup import require_secret_key

    try:
        require_secret_key()
    except ImproperlyConfigured as exc:
        raise SystemExit(f"celery: {exc}") from exc


@signals.setup_logging.connect(weak=False)
def _use_django_logging(**_kwargs) -> None:
    # Connected, this replaces Celery's logging set-up: Django already
    # configured the platform's handlers and formatter (settings.LOGGING).
    from logging.config import dictConfig

    from django.conf import settings

    dictConfig(settings.LOGGING)
