"""The usage settler: the usage stream into UsageRecords, once each.

Entries are appended as a worker (or the web tier with the database down)
appends them; the settler runs as the beat task or thread would. The
in-process stream and the Redis one (a consumer group) behave the same.
"""

from __future__ import annotations

import time
import uuid
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal

import pytest

from billing import ledger
from billing.models import UsageDeadLetter, UsageRecord
from billing.services import usage_dead_letter_retry, usage_settle_pending
from billing.services.budgets import NANO, account_name
from billing.tasks import usage_settle
from tenants.ratelimit import Limits, Ticket, get_limiter, reset_limiters
from tests.billing.conftest import MODEL
from tests.tenants.ratelimit_backends import redis_test_url
from wire.usage import MemoryUsageStream, UsageEntry, UsageTag, reset_usage_streams
from wire.usage.redis_stream import RedisUsageStream

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def only_this_tests_dead_letters():
    """Each test counts the dead letters it caused. Other processes' settlers
    write some too (entries a killed topology left in the shared usage
    stream, settled by a later test's Celery worker, name a tenant that test
    has since deleted); they are removed inside this test's transaction."""
    UsageDeadLetter.objects.all().delete()


def entry(tenant_id: int, *, created_at: float | None = None, **fields) -> UsageEntry:
    now = time.time()
    values = dict(
        response_id=f"chatcmpl-{uuid.uuid4().hex}",
        tenant_id=tenant_id,
        model=MODEL,
        status="completed",
        finish_reason="stop",
        prompt_tokens=10,
        cached_tokens=4,
        completion_tokens=5,
        queue_time_ms=3,
        ttft_ms=20,
        duration_ms=90,
        created_at=created_at or now - 1,
        finished_at=now,
        worker_id="w1",
        model_version="v1",
    )
    values.update(fields)
    return UsageEntry(**values)


@pytest.fixture(params=["memory", "redis"])
def stream(request):
    if request.param == "memory":
        yield MemoryUsageStream()
        return
    redis_stream = RedisUsageStream(redis_test_url(), key=f"test-usage-{uuid.uuid4().hex[:10]}")
    yield redis_stream
    redis_stream._redis.delete(redis_stream.key)
    redis_stream.close()


def append_raw(stream, payload: str) -> None:
    if isinstance(stream, MemoryUsageStream):
        stream.append_raw([payload])
    else:
        stream._redis.xadd(stream.key, {"u": payload})


def test_a_duplicate_delivery_makes_one_record_with_the_workers_counts(tenant_factory, stream):
    """The same entry twice (a worker retrying its append): one row, both acknowledged."""
    tenant = tenant_factory()
    e = entry(tenant.pk)
    stream.append([e])
    stream.append([e])
    report = usage_settle_pending(consumer="s1", stream=stream)
    assert (report.recorded, report.known, report.dead) == (1, 1, 0)
    record = UsageRecord.objects.get(response_id=e.response_id)
    assert (record.prompt_tokens, record.cached_tokens, record.completion_tokens) == (10, 4, 5)
    assert (record.worker_id, record.model_version, record.tier_id) == ("w1", "v1", tenant.tier_id)
    assert record.created_at == datetime.fromtimestamp(e.created_at, UTC)
    assert stream.size() == 0


def test_a_response_requested_last_month_settles_into_last_month(tenant_factory, stream):
    """Settled today, dated the month it happened: never the next, already invoiced one."""
    tenant = tenant_factory()
    first_of_month = datetime.now(UTC).replace(day=1, hour=0, minute=0, second=0, microsecond=0)
    last_second = first_of_month - timedelta(seconds=1)
    e = entry(tenant.pk, created_at=last_second.timestamp())
    stream.append([e])
    usage_settle_pending(consumer="s1", stream=stream)
    record = UsageRecord.objects.get(response_id=e.response_id)
    assert record.created_at == last_second
    assert (record.created_at.year, record.created_at.month) == (
        last_second.year,
        last_second.month,
    )


def test_poison_entries_are_set_aside_and_the_good_ones_behind_them_settle(tenant_factory, stream):
    tenant = tenant_factory()
    good = [entry(tenant.pk) for _ in range(3)]
    stream.append([good[0]])
    append_raw(stream, "{not json")
    stream.append([entry(987654321)])  # no such tenant
    stream.append([good[1]])
    # cached above prompt: the record's own validation refuses it.
    stream.append([entry(tenant.pk, prompt_tokens=2, cached_tokens=3, response_id="bad-cached")])
    stream.append([good[2]])

    report = usage_settle_pending(consumer="s1", stream=stream)

    assert (report.recorded, report.dead) == (3, 3)
    assert set(UsageRecord.objects.values_list("response_id", flat=True)) == {
        e.response_id for e in good
    }
    letters = {letter.reason: letter for letter in UsageDeadLetter.objects.all()}
    assert set(letters) == {"unparseable", "unknown_tenant", "invalid"}
    assert letters["unparseable"].payload == "{not json"
    assert "987654321" in letters["unknown_tenant"].error
    assert letters["invalid"].response_id == "bad-cached"
    assert "cached_tokens" in letters["invalid"].error
    # Acknowledged: the next run finds nothing, and sets nothing aside again.
    assert stream.size() == 0
    again = usage_settle_pending(consumer="s1", stream=stream)
    assert (again.recorded, again.known, again.dead) == (0, 0, 0)
    assert UsageDeadLetter.objects.count() == 3


def test_a_settler_that_dies_mid_batch_loses_nothing(tenant_factory, stream):
    """Entries read by a settler that never acknowledged them are claimed by
    another once idle, and settled once."""
    tenant = tenant_factory()
    entries = [entry(tenant.pk) for _ in range(4)]
    stream.append(entries)
    taken = stream.read("dead-settler", 3, 60_000)
    assert len(taken) == 3  # ... and then it died.

    # Not idle long enough yet: the live settler gets only the fourth.
    report = usage_settle_pending(consumer="s2", stream=stream, min_idle_ms=60_000)
    assert report.recorded == 1 and stream.size() == 3
    report = usage_settle_pending(consumer="s2", stream=stream, min_idle_ms=0)
    assert report.recorded == 3 and stream.size() == 0
    assert UsageRecord.objects.filter(tenant=tenant).count() == 4


def test_a_dead_letter_retried_after_its_cause_is_fixed_settles(tenant_factory, stream):
    tenant = tenant_factory()
    e = entry(tenant.pk, tag=UsageTag(api_key_id=None, tier_id=None))
    payload = e.to_json().replace(f'"tenant_id":{tenant.pk}', '"tenant_id":"x"')
    append_raw(stream, payload)
    usage_settle_pending(consumer="s1", stream=stream)
    letter = UsageDeadLetter.objects.get()
    assert "tenant_id" in letter.error
    # The operator repairs the payload, then retries from the admin.
    letter.payload = e.to_json()
    letter.save()
    assert usage_dead_letter_retry(letter=letter)
    assert UsageRecord.objects.filter(response_id=e.response_id).exists()
    assert not UsageDeadLetter.objects.exists()


def test_the_settler_settles_the_budget_hold_and_reservation_exactly_once(
    tenant_factory, price_factory, settings
):
    """Settled by the settler and again by the web's fast path (either order):
    the month's spend and quota count the response once."""
    settings.REDIS_URL = None  # the in-process ledger and limiter
    ledger.reset_ledgers()
    reset_limiters()
    tenant = tenant_factory()
    price = price_factory(tenant.tier, date(2020, 1, 1), "1000", "500", "2000")
    today = datetime.now(UTC).date()
    account = account_name(tenant_id=tenant.pk, salt=tenant.cache_salt, day=today)
    e = entry(tenant.pk)
    book = ledger.get_ledger()
    assert book.reserve(account=account, hold_id=e.response_id, amount=10**9, budget=10**12, seed=0)
    ticket = Ticket.for_response(response_id=e.response_id, api_key_id=None, tenant_id=tenant.pk)
    limits = Limits(100, 10**6, 100, 10**6, 10, 10**6)
    assert (
        get_limiter().admit(ticket=ticket, limits=limits, tokens=500, quota_seed=0).outcome == "ok"
    )
    tag = UsageTag(
        tier_id=tenant.tier_id,
        price_id=price.pk,
        budget_account=account,
        quota_period=ticket.period,
    )
    e = entry(tenant.pk, response_id=e.response_id, tag=tag)
    stream = MemoryUsageStream()
    stream.append([e, e])
    usage_settle_pending(consumer="s1", stream=stream)
    usage_settle_pending(consumer="s1", stream=stream)

    # 6 uncached x 1000 + 4 cached x 500 + 5 x 2000 per million tokens.
    assert Decimal(book.spent(account=account)) * NANO == Decimal("0.018")
    assert get_limiter().quota_used(tenant_id=tenant.pk, period=ticket.period) == 15
    assert UsageRecord.objects.get(response_id=e.response_id).price_id == price.pk


def test_the_settler_settles_a_batch_lines_claims_in_the_batch_lane(tenant_factory, settings):
    """A batch line (tag source "batch") holds a slot of the batch lane:
    the settler frees that slot, not an interactive one, and settles the
    month's shared quota to the line's usage."""
    settings.REDIS_URL = None  # the in-process limiter
    reset_limiters()
    tenant = tenant_factory()
    e = entry(tenant.pk)
    ticket = Ticket.for_response(
        response_id=e.response_id, api_key_id=None, tenant_id=tenant.pk, batch=True
    )
    limits = Limits(100, 10**6, 100, 10**6, 10, 10**6)
    assert (
        get_limiter().admit(ticket=ticket, limits=limits, tokens=500, quota_seed=0).outcome == "ok"
    )
    tag = UsageTag(tier_id=tenant.tier_id, quota_period=ticket.period, source="batch")
    stream = MemoryUsageStream()
    stream.append([entry(tenant.pk, response_id=e.response_id, tag=tag)])
    usage_settle_pending(consumer="s1", stream=stream)

    assert get_limiter().renew(ticket=ticket) is False
    assert get_limiter().quota_used(tenant_id=tenant.pk, period=ticket.period) == 15


def test_the_beat_task_settles_the_process_stream(tenant_factory, settings):
    """The Celery task reads the stream the bus configuration names (here the
    in-process one, as the embedded worker appends to it)."""
    settings.REDIS_URL = None
    reset_usage_streams()
    from wire.usage import get_usage_stream

    tenant = tenant_factory()
    e = entry(tenant.pk)
    get_usage_stream().append([e])
    assert usage_settle() == {"recorded": 1, "known": 0, "dead": 0}
    assert usage_settle() == {"recorded": 0, "known": 0, "dead": 0}
    assert UsageRecord.objects.filter(response_id=e.response_id).count() == 1
    reset_usage_streams()


def test_an_entry_raising_anything_is_set_aside_and_the_batch_settles(tenant_factory, stream):
    """An entry that raises outside the listed errors (a date in the year
    10000 overflows datetime) is dead-lettered, inspectable, and the entries
    around it settle; it was retried forever, blocking its batch."""
    tenant = tenant_factory()
    before, after = entry(tenant.pk), entry(tenant.pk)
    year_10000 = datetime(9999, 12, 31, 23, 59, 59, tzinfo=UTC).timestamp() + 3600
    odd = entry(tenant.pk, created_at=year_10000, response_id="far-future")
    stream.append([before, odd, after])

    report = usage_settle_pending(consumer="s1", stream=stream)

    assert (report.recorded, report.dead, report.interrupted) == (2, 1, False)
    assert set(UsageRecord.objects.values_list("response_id", flat=True)) == {
        before.response_id,
        after.response_id,
    }
    letter = UsageDeadLetter.objects.get()
    assert (letter.reason, letter.response_id) == ("error", "far-future")
    assert "year" in letter.error and "ValueError" in letter.error
    assert UsageEntry.from_json(letter.payload) == odd
    assert stream.size() == 0


def test_an_id_the_database_refuses_is_set_aside_alone(tenant_factory, stream):
    """A tenant id beyond bigint fails the batch's one lookup; the batch
    falls back to entry by entry and only that entry is set aside."""
    tenant = tenant_factory()
    good = entry(tenant.pk)
    stream.append([entry(2**70, response_id="huge-id"), good])

    report = usage_settle_pending(consumer="s1", stream=stream)

    assert (report.recorded, report.dead, report.interrupted) == (1, 1, False)
    assert UsageRecord.objects.filter(response_id=good.response_id).exists()
    assert UsageDeadLetter.objects.get().response_id == "huge-id"
    assert stream.size() == 0
