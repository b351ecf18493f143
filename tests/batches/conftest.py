"""The Batch API's fixtures: batch tasks in threads of the test process.

``batches_in_process`` runs the tasks as embedded mode does (no Celery
worker: ``BATCHES_IN_PROCESS``), on the in-process bus of the fake worker
or the real engine, and short feed rounds so a cancel is seen at once.
"""

from __future__ import annotations

import io
import json

import pytest


@pytest.fixture
def batch_files(settings, tmp_path):
    """Batch files in a directory of the test's own."""
    settings.BATCH_FEED_ROUND_SECONDS = 2.0
    settings.STORAGES = {
        **settings.STORAGES,
        "batches": {
            "BACKEND": "django.core.files.storage.FileSystemStorage",
            "OPTIONS": {"location": str(tmp_path / "batch-files")},
        },
    }
    return tmp_path / "batch-files"


@pytest.fixture
def batches_in_process(settings, batch_files):
    settings.BATCHES_IN_PROCESS = True
    return settings


@pytest.fixture(scope="module")
def batches_celery_worker():
    """A real Celery worker thread on the ``batches`` queue (the broker on Redis)."""
    from celery.contrib.testing.worker import start_worker

    from config.celery_app import app
    from tests.redis_helpers import celery_test_url, redis_up

    url = celery_test_url()
    if not redis_up(url):
        pytest.skip("Redis is not reachable")
    app.conf.update(broker_url=url, result_backend=url, task_always_eager=False)
    with app.connection_for_write() as conn:
        conn.default_channel.queue_purge("batches")
    with start_worker(
        app,
        pool="threads",
        concurrency=4,
        perform_ping_check=False,
        queues=["batches"],
        shutdown_timeout=30,
    ) as worker:
        yield worker


def jsonl(*records) -> io.BytesIO:
    """A JSONL file of ``records`` (dicts, or raw lines as str)."""
    lines = [r if isinstance(r, str) else json.dumps(r) for r in records]
    return io.BytesIO(("\n".join(lines) + "\n").encode())


def chat_line(custom_id: str, text: str = "Hello", **body) -> dict:
    return {
        "custom_id": custom_id,
        "method": "POST",
        "url": "/v1/chat/completions",
        "body": {
            "model": "smollm2-135m-instruct",
            "messages": [{"role": "user", "content": text}],
            "max_tokens": 8,
            **body,
        },
    }
