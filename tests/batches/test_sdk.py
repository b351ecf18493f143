"""The Files and Batch API through the official openai SDK, with a scripted worker.

Lines run through the real request path (auth, model access, moderation,
limits, dispatch, relay, usage) on the in-process bus; the batch tasks run
in threads as in embedded mode (``batches_in_process``).
"""

from __future__ import annotations

import json
from decimal import Decimal

import openai
import pytest
from asgiref.sync import sync_to_async

from batches.models import Batch, BatchLine
from billing.models import UsageRecord
from tests.batches.conftest import chat_line, jsonl
from tests.helpers import async_wait_until
from tests.plugins.asgi_client import sdk_client
from wire.requests import ServiceClass

pytestmark = [
    pytest.mark.asyncio,
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("close_db_threads", "demo_model", "batches_in_process"),
]


async def new_key(api_key_factory, tier: str = "pro") -> tuple[str, int]:
    key, raw = await sync_to_async(api_key_factory)(tier=tier)
    return raw, key.tenant_id


async def finished(client, batch_id: str, timeout: float = 30):
    async def done():
        batch = await client.batches.retrieve(batch_id)
        return batch if batch.status in ("completed", "failed", "expired", "cancelled") else None

    return await async_wait_until(done, timeout=timeout, interval=0.2)


def lines_of(content: bytes) -> list[dict]:
    return [json.loads(line) for line in content.decode().splitlines() if line.strip()]


async def test_a_batch_runs_every_line_once_at_the_batch_price(fake_worker, api_key_factory):
    """Upload, create, wait, download: one output line per custom_id in
    OpenAI's shape, each run as a batch-class request and billed once at
    half price."""
    worker = fake_worker(tokens=3)
    raw, tenant_id = await new_key(api_key_factory)
    client = sdk_client(raw)
    upload = await client.files.create(
        file=("requests.jsonl", jsonl(*(chat_line(f"req-{i}") for i in range(5)))),
        purpose="batch",
    )
    assert upload.purpose == "batch" and upload.bytes > 0 and upload.id.startswith("file-")
    batch = await client.batches.create(
        input_file_id=upload.id,
        endpoint="/v1/chat/completions",
        completion_window="24h",
        metadata={"job": "nightly"},
    )
    assert batch.status == "validating" and batch.metadata == {"job": "nightly"}
    assert batch.expires_at - batch.created_at == 24 * 3600
    batch = await finished(client, batch.id)
    assert batch.status == "completed"
    assert (batch.request_counts.total, batch.request_counts.completed) == (5, 5)
    assert batch.request_counts.failed == 0 and batch.error_file_id is None
    assert batch.in_progress_at and batch.finalizing_at and batch.completed_at
    output = lines_of((await client.files.content(batch.output_file_id)).content)
    assert sorted(r["custom_id"] for r in output) == [f"req-{i}" for i in range(5)]
    first = output[0]
    assert first["error"] is None and first["id"].startswith("batch_req_")
    assert first["response"]["status_code"] == 200
    assert first["response"]["body"]["object"] == "chat.completion"
    assert first["response"]["body"]["choices"][0]["message"]["content"]
    assert {r.service_class for r in worker.received} == {ServiceClass.BATCH}
    assert len(worker.received) == 5

    def records():
        return list(UsageRecord.objects.filter(tenant_id=tenant_id))

    usage = await sync_to_async(records)()
    assert len(usage) == 5
    assert {(u.source, u.price_multiplier) for u in usage} == {("batch", Decimal("0.500"))}
    listed = await client.batches.list(limit=10)
    assert [b.id for b in listed.data] == [batch.id]
    output_file = await client.files.retrieve(batch.output_file_id)
    assert output_file.purpose == "batch_output"


async def test_bad_lines_fail_the_batch_with_their_line_numbers(fake_worker, api_key_factory):
    """Every bad line is reported, numbered, in OpenAI's errors shape; no
    line runs."""
    worker = fake_worker()
    raw, _ = await new_key(api_key_factory)
    client = sdk_client(raw)
    bad_method = {**chat_line("b"), "method": "GET"}
    bad_body = chat_line("d", temperature="hot")
    wrong_url = {**chat_line("e"), "url": "/v1/embeddings"}
    content = jsonl(chat_line("a"), bad_method, chat_line("a"), bad_body, wrong_url, "{not json")
    upload = await client.files.create(file=("bad.jsonl", content), purpose="batch")
    batch = await client.batches.create(
        input_file_id=upload.id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    batch = await finished(client, batch.id)
    assert batch.status == "failed" and batch.failed_at
    errors = [(e.line, e.code, e.param) for e in batch.errors.data]
    assert errors == [
        (2, "invalid_method", "method"),
        (3, "duplicate_custom_id", "custom_id"),
        (4, "invalid_type", "body.temperature"),
        (5, "invalid_url", "url"),
        (6, "invalid_json_line", None),
    ]
    assert worker.received == []
    assert not await sync_to_async(BatchLine.objects.filter(batch_id=batch.id).exists)()


async def test_files_and_batches_are_the_tenants_own(fake_worker, api_key_factory):
    """Another tenant's file and batch are as unknown as missing ones."""
    fake_worker()
    raw, _ = await new_key(api_key_factory)
    other, _ = await new_key(api_key_factory)
    client, stranger = sdk_client(raw), sdk_client(other)
    upload = await client.files.create(file=("a.jsonl", jsonl(chat_line("a"))), purpose="batch")
    batch = await client.batches.create(
        input_file_id=upload.id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    for call in (
        lambda: stranger.files.retrieve(upload.id),
        lambda: stranger.files.content(upload.id),
        lambda: stranger.files.delete(upload.id),
        lambda: stranger.batches.retrieve(batch.id),
        lambda: stranger.batches.cancel(batch.id),
        lambda: stranger.batches.create(
            input_file_id=upload.id, endpoint="/v1/chat/completions", completion_window="24h"
        ),
    ):
        with pytest.raises(openai.NotFoundError):
            await call()
    assert (await stranger.files.list()).data == []
    assert (await stranger.batches.list()).data == []
    # A misspelt query parameter is refused, not ignored (it would page wrongly).
    for listing in (stranger.files.list, stranger.batches.list):
        with pytest.raises(openai.BadRequestError) as error:
            await listing(extra_query={"limt": 5})
        assert (error.value.code, error.value.param) == ("unknown_parameter", "limt")
    await finished(client, batch.id)


async def test_an_upload_past_the_tiers_limit_is_a_413(api_key_factory, tiers):
    raw, _ = await new_key(api_key_factory)

    def shrink():
        tiers["pro"].max_batch_file_bytes = 100
        tiers["pro"].save()

    await sync_to_async(shrink)()
    client = sdk_client(raw)
    content = jsonl(*(chat_line(f"r{i}") for i in range(5)))
    with pytest.raises(openai.APIStatusError) as error:
        await client.files.create(file=("big.jsonl", content), purpose="batch")
    assert error.value.status_code == 413
    assert error.value.body["code"] == "file_too_large"
    with pytest.raises(openai.BadRequestError) as error:
        await client.files.create(file=("a.jsonl", jsonl(chat_line("a"))), purpose="fine-tune")
    assert error.value.body["param"] == "purpose"


async def test_cancel_mid_batch_aborts_lines_in_flight_and_errors_the_rest(
    fake_worker, api_key_factory, settings
):
    """Held lines are aborted on the worker; every line ends as one error line."""
    settings.BATCH_MAX_IN_FLIGHT_PER_BATCH = 2
    worker = fake_worker(mode="hold")
    raw, _ = await new_key(api_key_factory)
    client = sdk_client(raw)
    upload = await client.files.create(
        file=("r.jsonl", jsonl(*(chat_line(f"r{i}") for i in range(6)))), purpose="batch"
    )
    batch = await client.batches.create(
        input_file_id=upload.id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    # The bound: two lines in flight, no more, while the worker holds them.
    await async_wait_until(lambda: len(worker.received) == 2, timeout=20)
    assert len(worker.received) == 2
    cancelling = await client.batches.cancel(batch.id)
    assert cancelling.status == "cancelling" and cancelling.cancelling_at
    batch = await finished(client, batch.id)
    assert batch.status == "cancelled" and batch.cancelled_at
    assert batch.output_file_id is None
    errors = lines_of((await client.files.content(batch.error_file_id)).content)
    assert sorted(e["custom_id"] for e in errors) == [f"r{i}" for i in range(6)]
    assert {e["error"]["code"] for e in errors} == {"batch_cancelled"}
    await async_wait_until(lambda: len(worker.aborted) == 2, timeout=10)
    assert batch.request_counts.failed == 6


async def test_a_batch_past_its_window_expires_with_error_lines_for_the_rest(
    fake_worker, api_key_factory
):
    from django.utils import timezone

    from batches import tasks

    worker = fake_worker(mode="hold")
    raw, _ = await new_key(api_key_factory)
    client = sdk_client(raw)
    upload = await client.files.create(
        file=("r.jsonl", jsonl(*(chat_line(f"r{i}") for i in range(3)))), purpose="batch"
    )
    batch = await client.batches.create(
        input_file_id=upload.id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    await async_wait_until(lambda: len(worker.received) == 3, timeout=20)
    await sync_to_async(Batch.objects.filter(pk=batch.id).update)(expires_at=timezone.now())
    await sync_to_async(tasks.batches_sweep.apply)()
    batch = await finished(client, batch.id)
    assert batch.status == "expired" and batch.expired_at
    errors = lines_of((await client.files.content(batch.error_file_id)).content)
    assert [e["error"]["code"] for e in errors] == ["batch_expired"] * 3


async def test_a_line_whose_generation_failed_is_an_error_line_not_a_retry(
    fake_worker, api_key_factory
):
    """The worker failed the generation: the line ends in the error file
    with the API's error, and is not sent again."""
    worker = fake_worker(mode="fail")
    raw, _ = await new_key(api_key_factory)
    client = sdk_client(raw)
    upload = await client.files.create(file=("r.jsonl", jsonl(chat_line("only"))), purpose="batch")
    batch = await client.batches.create(
        input_file_id=upload.id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    batch = await finished(client, batch.id)
    assert batch.status == "completed" and batch.output_file_id is None
    (error,) = lines_of((await client.files.content(batch.error_file_id)).content)
    assert error["custom_id"] == "only" and error["response"]["status_code"] >= 500
    assert error["response"]["body"]["error"]["message"]
    assert len(worker.received) == 1


async def test_a_batch_past_the_tiers_batch_queue_fails_with_token_limit_exceeded(
    fake_worker, api_key_factory, tiers
):
    """Enqueued tokens (prompt plus every token the lines may generate)
    count against the tier's batch queue, with the batches in progress."""
    fake_worker(mode="hold")
    raw, _ = await new_key(api_key_factory)

    def limit(tokens: int):
        tiers["pro"].batch_queue_tokens = tokens
        tiers["pro"].save()

    await sync_to_async(limit)(1000)
    client = sdk_client(raw)

    async def start(n: int):
        upload = await client.files.create(
            file=("r.jsonl", jsonl(*(chat_line(f"r{i}", max_tokens=200) for i in range(n)))),
            purpose="batch",
        )
        return await client.batches.create(
            input_file_id=upload.id, endpoint="/v1/chat/completions", completion_window="24h"
        )

    first = await start(3)
    await async_wait_until(
        lambda: sync_to_async(Batch.objects.filter(pk=first.id, status="in_progress").exists)(),
        timeout=20,
    )
    tokens = await sync_to_async(lambda: Batch.objects.get(pk=first.id).enqueued_tokens)()
    # Three lines of 200 completion tokens and a short prompt each.
    assert 600 < tokens < 700
    second = await finished(client, (await start(2)).id)
    assert second.status == "failed"
    (error,) = second.errors.data
    assert error.code == "token_limit_exceeded" and error.line is None
    assert f"batches in progress {tokens}" in error.message
    await client.batches.cancel(first.id)
    await finished(client, first.id)
