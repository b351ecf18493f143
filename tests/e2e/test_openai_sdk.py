"""End to end with the official openai SDK, on both deployments.

1. The real topology: Daphne + one ``gpuworker`` process + PostgreSQL + Redis.
2. Embedded: Daphne alone on SQLite, in-process bus and engine thread.
"""

import sqlite3

import openai
import pytest

from billing.models import UsageRecord
from tests.e2e.flows import MESSAGES, MODEL, client_for, run_openai_flow

pytestmark = pytest.mark.slow


def postgres_usage_row(response_id: str) -> dict:
    row = UsageRecord.objects.get(response_id=response_id)
    return {
        "prompt_tokens": row.prompt_tokens,
        "completion_tokens": row.completion_tokens,
        "cached_tokens": row.cached_tokens,
        "status": row.status,
    }


@pytest.mark.django_db
def test_openai_sdk_against_daphne_gpuworker_postgres_redis(topology):
    run_openai_flow(topology.base_url, topology.keys["pro"], postgres_usage_row)
    # One row per generated response (2 x 2 sampling runs, 2 with n=2), each
    # naming the worker that served it; rejected requests leave none.
    rows = UsageRecord.objects.filter(tenant_id__in=topology.tenant_ids)
    assert rows.count() == len(set(rows.values_list("response_id", flat=True))) == 6
    assert set(rows.values_list("worker_id", flat=True)) == {topology.worker_id}
    # The free tier is console-only.
    with pytest.raises(openai.PermissionDeniedError):
        client_for(topology.base_url, topology.keys["free"]).chat.completions.create(
            model=MODEL, messages=MESSAGES
        )


def test_openai_sdk_in_embedded_mode(embedded):
    def usage_row(response_id: str) -> dict:
        with sqlite3.connect(embedded.sqlite_path) as db:
            row = db.execute(
                "SELECT prompt_tokens, completion_tokens, cached_tokens, status"
                " FROM billing_usagerecord WHERE response_id = ?",
                (response_id,),
            ).fetchone()
        assert row is not None, response_id
        fields = ("prompt_tokens", "completion_tokens", "cached_tokens", "status")
        return dict(zip(fields, row, strict=True))

    run_openai_flow(embedded.base_url, embedded.key, usage_row)
