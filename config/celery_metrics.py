"""Celery task metrics from Celery's own task signals, on the worker's port.

No library in this project's dependencies exports Celery task metrics
from inside the worker (exporters like celery-exporter are separate
services reading the broker's event stream), so the two task signals do:

- ``llmp_celery_tasks_total{task,state}``: task runs by final state
  (``success``, ``failure``, ``retry``, ...): runs are the sum, failures
  ``state="failure"``.
- ``llmp_celery_task_duration_seconds{task}``: run time, whatever the end.

A Celery worker serves them on ``CELERY_METRICS_PORT`` once it is ready.
The prefork pool runs tasks in child processes; with
``PROMETHEUS_MULTIPROC_DIR`` set for the worker (docker/compose.yaml does)
prometheus-client keeps every child's numbers in that directory and the
port serves them all; without it only the solo and thread pools report.
"""

from __future__ import annotations

import logging
import os
import time

from celery import signals
from prometheus_client import REGISTRY, CollectorRegistry, Counter, Histogram, start_http_server

logger = logging.getLogger(__name__)

TASKS = Counter("llmp_celery_tasks", "Celery task runs by final state.", ("task", "state"))
DURATION = Histogram(
    "llmp_celery_task_duration_seconds",
    "Celery task run time in seconds.",
    ("task",),
    buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0),
)

# task id -> monotonic start; a task runs in one process from prerun to postrun.
_started: dict[str, float] = {}


@signals.task_prerun.connect(weak=False)
def _task_started(task_id: str | None = None, **_kwargs) -> None:
    if task_id is not None:
        _started[task_id] = time.monotonic()


@signals.task_postrun.connect(weak=False)
def _task_ended(task_id=None, task=None, state=None, **_kwargs) -> None:
    started = _started.pop(task_id, None)
    name = getattr(task, "name", None) or "unknown"
    TASKS.labels(name, (state or "unknown").lower()).inc()
    if started is not None:
        DURATION.labels(name).observe(time.monotonic() - started)


@signals.worker_ready.connect(weak=False)
def _serve_metrics(**_kwargs) -> None:
    from django.conf import settings

    port = settings.CELERY_METRICS_PORT
    if not port:
        return
    start_http_server(port, registry=_registry())
    logger.info("celery metrics on port %d", port)


@signals.worker_process_shutdown.connect(weak=False)
def _child_gone(pid=None, **_kwargs) -> None:
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        from prometheus_client import multiprocess

        multiprocess.mark_process_dead(pid or os.getpid())


def _registry() -> CollectorRegistry:
    if not os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        return REGISTRY
    from prometheus_client import multiprocess

    registry = CollectorRegistry()
    multiprocess.MultiProcessCollector(registry)
    return registry
