"""A batch end to end on the real engine: SDK -> Celery worker -> request path -> engine.

The batch tasks go through Redis to a real Celery worker (threads, in this
process, so it shares the in-process bus the engine's worker loop serves).
"""

from __future__ import annotations

import json

import pytest
from asgiref.sync import sync_to_async

from batches.models import BatchLine
from billing.models import UsageRecord
from tests.batches.conftest import chat_line, jsonl
from tests.batches.test_sdk import finished, lines_of
from tests.plugins.asgi_client import sdk_client

pytestmark = [
    pytest.mark.asyncio,
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("close_db_threads", "demo_model", "batch_files"),
]


async def test_a_batch_on_the_demo_model_through_celery(
    demo_worker, batches_celery_worker, api_key_factory, settings
):
    settings.BATCHES_IN_PROCESS = False
    key, raw = await sync_to_async(api_key_factory)(tier="pro")
    client = sdk_client(raw)
    questions = ["What is the capital of France?", "Name a colour.", "Say hello."]
    completions_line = {
        "custom_id": "text",
        "method": "POST",
        "url": "/v1/completions",
        "body": {"model": "smollm2-135m-instruct", "prompt": "Once upon", "max_tokens": 4},
    }
    chat = [chat_line(f"q{i}", q, temperature=0) for i, q in enumerate(questions)]
    upload = await client.files.create(file=("q.jsonl", jsonl(*chat)), purpose="batch")
    batch = await client.batches.create(
        input_file_id=upload.id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    batch = await finished(client, batch.id, timeout=120)
    assert batch.status == "completed", batch
    assert (batch.request_counts.completed, batch.request_counts.failed) == (3, 0)
    output = lines_of((await client.files.content(batch.output_file_id)).content)
    by_id = {r["custom_id"]: r["response"]["body"] for r in output}
    assert set(by_id) == {"q0", "q1", "q2"}
    assert "Paris" in by_id["q0"]["choices"][0]["message"]["content"]
    assert all(body["usage"]["completion_tokens"] > 0 for body in by_id.values())

    # The legacy endpoint too, as its own batch.
    upload = await client.files.create(file=("t.jsonl", jsonl(completions_line)), purpose="batch")
    text_batch = await client.batches.create(
        input_file_id=upload.id, endpoint="/v1/completions", completion_window="24h"
    )
    text_batch = await finished(client, text_batch.id, timeout=120)
    assert text_batch.status == "completed"
    (line,) = lines_of((await client.files.content(text_batch.output_file_id)).content)
    assert line["response"]["body"]["object"] == "text_completion"

    def usage():
        ids = BatchLine.objects.filter(batch__tenant_id=key.tenant_id).values_list(
            "response_id", flat=True
        )
        records = UsageRecord.objects.filter(tenant_id=key.tenant_id)
        return sorted(ids), sorted(r.response_id for r in records), {r.source for r in records}

    line_ids, record_ids, sources = await sync_to_async(usage)()
    # One record per line, under the line's own response id: billed once.
    assert record_ids == line_ids and sources == {"batch"}
    assert json.dumps(output)
