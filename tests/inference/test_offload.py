"""Work run off the event loop gives its pooled database connection back."""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor

import pytest
from asgiref.sync import sync_to_async
from django.db import connections

from inference.offload import idle_connections_close, offloaded
from tenants.models import Tier

pytestmark = [pytest.mark.asyncio, pytest.mark.django_db(transaction=True)]


def _checked_out() -> int:
    pool = connections["default"].pool
    stats = pool.get_stats()
    return stats["pool_size"] - stats["pool_available"]


def _query() -> int:
    return Tier.objects.count()


async def test_offloaded_queries_leave_no_connection_checked_out():
    """Each call runs in one of the loop's executor threads; without the
    close, every thread kept a pooled connection for good."""
    if connections["default"].vendor != "postgresql":
        pytest.skip("the connection pool is PostgreSQL's (the test run's DATABASE_URL)")
    before = await sync_to_async(_checked_out)()
    for _ in range(12):
        await offloaded(_query)()
    assert await sync_to_async(_checked_out)() == before

    # The same query in a plain thread keeps its connection: what each
    # executor thread did before (closed here, so the run's pool stays whole).
    loop = asyncio.get_running_loop()
    with ThreadPoolExecutor(max_workers=1) as thread:
        await loop.run_in_executor(thread, _query)
        assert await sync_to_async(_checked_out)() == before + 1
        await loop.run_in_executor(thread, idle_connections_close)
    assert await sync_to_async(_checked_out)() == before
