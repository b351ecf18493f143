"""Running lines: restarts resume where the batch was, billed once; a budget stop."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal

import pytest
from asgiref.sync import sync_to_async
from django.utils import timezone

from batches.models import Batch, BatchLine
from batches.services import batches as batch_services
from batches.services import execution
from batches.services.execution import LineResult, Next, Outcome
from batches.services.files import file_open, file_upload
from billing.models import Price, UsageRecord
from tests.batches.conftest import chat_line, jsonl
from tests.batches.test_sdk import finished, lines_of
from tests.helpers import async_wait_until
from tests.plugins.asgi_client import sdk_client
from tests.plugins.request_path import DEMO
from tests.usage_records import record_usage

pytestmark = pytest.mark.django_db(transaction=True)


def new_batch(api_key, count: int) -> Batch:
    content = jsonl(*(chat_line(f"r{i}") for i in range(count)))
    size = len(content.getvalue())
    file = file_upload(
        tenant=api_key.tenant, purpose="batch", filename="r.jsonl", content=content, size=size
    )
    batch = batch_services.batch_create(
        api_key=api_key,
        input_file_id=file.pk,
        endpoint="/v1/chat/completions",
        completion_window="24h",
    )
    batch_services.batch_validate(batch_id=batch.pk)
    return Batch.objects.get(pk=batch.pk)


@pytest.mark.usefixtures("demo_model", "batch_files", "close_db_threads")
def test_a_feeder_that_died_mid_line_is_resumed_and_the_line_billed_once(
    fake_worker, api_key_factory, settings
):
    """Line 1 was claimed by a feeder that died after its usage was
    recorded; line 2 finished before. The next round runs what is left:
    every custom_id ends as exactly one result, line 1 keeps its one usage
    record, and line 2 is not run again."""
    settings.BATCHES_IN_PROCESS = False
    worker = fake_worker()
    key, _ = api_key_factory(tier="pro")
    batch = new_batch(key, 4)
    assert (batch.status, batch.total) == ("in_progress", 4)
    line1, line2 = BatchLine.objects.filter(batch=batch).order_by("line")[:2]
    long_ago = timezone.now() - timedelta(seconds=settings.BATCH_LINE_LEASE_SECONDS + 1)
    BatchLine.objects.filter(pk=line1.pk).update(status="running", claimed_at=long_ago)
    record_usage(
        tenant_id=key.tenant_id,
        model=DEMO,
        response_id=line1.response_id,
        source="batch",
        prompt_tokens=5,
        completion_tokens=3,
    )
    BatchLine.objects.filter(pk=line2.pk).update(
        status="succeeded", result={"id": "x", "custom_id": "r1", "response": {}, "error": None}
    )
    assert execution.batch_feed(batch_id=batch.pk) == Next.FINALIZE
    assert execution.batch_finalize(batch_id=batch.pk)
    batch.refresh_from_db()
    assert (batch.status, batch.completed, batch.failed) == ("completed", 4, 0)
    # Lines 1, 3 and 4 ran (line 1 again, under its own response id).
    assert sorted(r.response_id for r in worker.received) == sorted(
        BatchLine.objects.filter(batch=batch)
        .exclude(pk=line2.pk)
        .values_list("response_id", flat=True)
    )
    assert UsageRecord.objects.filter(response_id=line1.response_id).count() == 1
    assert UsageRecord.objects.filter(tenant_id=key.tenant_id).count() == 3
    with file_open(file=batch.output_file) as handle:
        custom_ids = [line["custom_id"] for line in lines_of(handle.read())]
    assert sorted(custom_ids) == ["r0", "r1", "r2", "r3"]


@pytest.mark.asyncio
@pytest.mark.usefixtures("demo_model", "batches_in_process", "close_db_threads")
async def test_a_batch_past_the_budget_stops_with_insufficient_quota(
    fake_worker, api_key_factory, tiers
):
    """The first line's budget hold does not fit: that line and every
    remaining one error with insufficient_quota, and nothing runs."""
    worker = fake_worker()

    def setup():
        key, raw = api_key_factory(tier="pro")
        Price.objects.create(
            model=DEMO,
            tier=tiers["pro"],
            effective_from=timezone.now().date() - timedelta(days=1),
            prompt_per_million=Decimal(1000),
            cached_prompt_per_million=Decimal(1000),
            completion_per_million=Decimal(1000),
        )
        key.tenant.monthly_budget = Decimal("0.01")
        key.tenant.save()
        return raw

    client = sdk_client(await sync_to_async(setup)())
    upload = await client.files.create(
        file=("r.jsonl", jsonl(*(chat_line(f"r{i}", max_tokens=2000) for i in range(3)))),
        purpose="batch",
    )
    batch = await client.batches.create(
        input_file_id=upload.id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    batch = await finished(client, batch.id)
    assert batch.status == "completed"
    assert (batch.request_counts.completed, batch.request_counts.failed) == (0, 3)
    errors = lines_of((await client.files.content(batch.error_file_id)).content)
    codes = [
        (e["response"] or {}).get("body", {}).get("error", {}).get("code") or e["error"]["code"]
        for e in errors
    ]
    assert codes == ["insufficient_quota"] * 3
    assert worker.received == []


@pytest.mark.usefixtures("demo_model", "batch_files", "close_db_threads")
def test_a_line_that_reached_a_worker_before_its_feeder_died_is_read_back_not_rerun(
    fake_worker, api_key_factory, settings
):
    """The feeder died after the worker answered but before the line's
    result was stored: the next feeder reads the answer back from the
    response stream. The worker saw the request once; one usage record."""
    settings.BATCHES_IN_PROCESS = False
    worker = fake_worker(texts=["Hello", " again"])
    key, _ = api_key_factory(tier="pro")
    batch = new_batch(key, 1)
    assert execution.batch_feed(batch_id=batch.pk) == Next.FINALIZE
    (line,) = BatchLine.objects.filter(batch=batch)
    first = line.result["response"]["body"]
    long_ago = timezone.now() - timedelta(seconds=settings.BATCH_LINE_LEASE_SECONDS + 1)
    BatchLine.objects.filter(pk=line.pk).update(status="running", claimed_at=long_ago, result=None)
    assert execution.batch_feed(batch_id=batch.pk) == Next.FINALIZE
    line.refresh_from_db()
    assert (line.status, line.attempts) == ("succeeded", 2)
    assert line.result["response"]["body"]["choices"] == first["choices"]
    assert first["choices"][0]["message"]["content"] == "Hello again"
    assert len(worker.received) == 1
    assert UsageRecord.objects.filter(response_id=line.response_id).count() == 1
    assert execution.batch_finalize(batch_id=batch.pk)
    assert Batch.objects.get(pk=batch.pk).status == "completed"


@pytest.mark.asyncio
@pytest.mark.usefixtures("demo_model", "batches_in_process", "close_db_threads")
async def test_a_batch_line_holds_its_budget_at_the_batch_price(
    fake_worker, api_key_factory, tiers
):
    """A budget the request's worst case passes at the full price but not at
    half: the interactive request is refused, the same request as a batch
    line runs, and its usage settles at the batch price."""
    import openai

    from billing.selectors.budgets import month_spend
    from billing.services.budgets import spend_this_month

    fake_worker(tokens=2)
    body = chat_line("only", max_tokens=100)["body"]

    def setup():
        key, raw = api_key_factory(tier="pro")
        Price.objects.create(
            model=DEMO,
            tier=tiers["pro"],
            effective_from=timezone.now().date() - timedelta(days=1),
            prompt_per_million=Decimal(100_000),
            cached_prompt_per_million=Decimal(100_000),
            completion_per_million=Decimal(100_000),
        )
        # ~130 tokens at most: about 13.0 at the full price, 6.5 at half.
        key.tenant.monthly_budget = Decimal("10.00")
        key.tenant.save()
        return raw, key.tenant

    raw, tenant = await sync_to_async(setup)()
    client = sdk_client(raw)
    with pytest.raises(openai.RateLimitError) as refused:
        await client.chat.completions.create(**body)
    assert refused.value.code == "insufficient_quota"
    upload = await client.files.create(
        file=("r.jsonl", jsonl(chat_line("only", max_tokens=100))), purpose="batch"
    )
    batch = await client.batches.create(
        input_file_id=upload.id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    batch = await finished(client, batch.id)
    assert (batch.status, batch.request_counts.completed) == ("completed", 1)
    (record,) = await sync_to_async(list)(UsageRecord.objects.filter(tenant=tenant))
    expected = (record.prompt_tokens + record.completion_tokens) * Decimal("0.05")
    spent = await sync_to_async(spend_this_month)(tenant_id=tenant.pk)
    assert spent == expected
    period = timezone.now().date().replace(day=1)
    assert await sync_to_async(month_spend)(tenant=tenant, period=period) == expected


@pytest.mark.asyncio
@pytest.mark.usefixtures("demo_model", "batches_in_process", "close_db_threads")
async def test_batch_lines_do_not_count_against_the_keys_requests_per_minute(
    fake_worker, api_key_factory
):
    """A key limited to 2 requests a minute: a 3-line batch between its
    first and second interactive requests runs every line at once (no line
    waits for the minute) and leaves the second request admitted; with the
    key at its limit (a third request refused) another batch still runs.
    Every line is still billed: one usage record each, at the batch source."""
    import openai

    fake_worker(tokens=2)
    key, raw = await sync_to_async(api_key_factory)(tier="pro", rpm_limit=2)
    client = sdk_client(raw)
    body = chat_line("x", max_tokens=8)["body"]

    async def run_batch(count: int, prefix: str):
        upload = await client.files.create(
            file=("r.jsonl", jsonl(*(chat_line(f"{prefix}{i}") for i in range(count)))),
            purpose="batch",
        )
        batch = await client.batches.create(
            input_file_id=upload.id, endpoint="/v1/chat/completions", completion_window="24h"
        )
        # Well within the minute a refused line would wait for.
        return await finished(client, batch.id, timeout=30)

    await client.chat.completions.create(**body)
    batch = await run_batch(3, "a")
    assert (batch.status, batch.request_counts.completed) == ("completed", 3)
    await client.chat.completions.create(**body)
    with pytest.raises(openai.RateLimitError) as refused:
        await client.chat.completions.create(**body)
    assert refused.value.code == "rate_limit_exceeded"
    batch = await run_batch(2, "b")
    assert (batch.status, batch.request_counts.completed) == ("completed", 2)

    def sources() -> list[str]:
        return sorted(
            UsageRecord.objects.filter(tenant=key.tenant).values_list("source", flat=True)
        )

    async def all_billed() -> bool:
        return await sync_to_async(sources)() == ["api"] * 2 + ["batch"] * 5

    await async_wait_until(all_billed, timeout=10)


@pytest.mark.usefixtures("demo_model", "batch_files")
def test_lines_that_finish_together_are_recorded_in_one_go(api_key_factory):
    """A claim stays within the pacing bound; the lines finished together
    are stored at once: results, the batch's counters, a budget stop; a
    line no longer running (another feeder's now) is left as it is."""
    key, _ = api_key_factory(tier="pro")
    batch = new_batch(key, 5)
    claimed = execution.lines_claim(batch_id=batch.pk, want=5, limit=3)
    assert [line.line for line in claimed] == [1, 2, 3]
    assert execution.lines_claim(batch_id=batch.pk, want=5, limit=3) == []
    ok, stop, gone = claimed
    BatchLine.objects.filter(pk=gone.pk).update(status="pending", claimed_at=None)
    record = {"id": "x", "custom_id": "c", "response": {}, "error": None}
    execution.lines_finish(
        results=[
            (ok, LineResult(Outcome.SUCCEEDED, record)),
            (stop, LineResult(Outcome.STOP, record)),
            (gone, LineResult(Outcome.SUCCEEDED, record)),
        ]
    )
    statuses = dict(BatchLine.objects.filter(batch=batch).values_list("line", "status"))
    assert statuses == {1: "succeeded", 2: "failed", 3: "pending", 4: "pending", 5: "pending"}
    assert BatchLine.objects.get(pk=ok.pk).result == record
    batch.refresh_from_db()
    assert (batch.completed, batch.failed, batch.stop_code) == (1, 1, "insufficient_quota")
