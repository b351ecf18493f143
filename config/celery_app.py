"""The Celery application: billing (invoices, roll-ups, budgets, reports) and fleet tasks.

Configuration comes from Django settings (``CELERY_*``): broker and result
backend on Redis, late acks, the queue routes and the beat schedule. Run a
worker with ``celery -A config.celery_app worker -Q billing,fleet`` and the
scheduler with ``celery -A config.celery_app beat``.
"""

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")

# The Django task class gives every task delay_on_commit / apply_async_on_commit.
app = Celery("config", task_cls="celery.contrib.django.task:DjangoTask")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
