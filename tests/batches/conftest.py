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
def batches_in_process(settings, tmp_path):
    settings.BATCHES_IN_PROCESS = True
    settings.BATCH_FEED_ROUND_SECONDS = 2.0
    settings.STORAGES = {
        **settings.STORAGES,
        "batches": {
            "BACKEND": "django.core.files.storage.FileSystemStorage",
            "OPTIONS": {"location": str(tmp_path / "batch-files")},
        },
    }
    return settings


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
