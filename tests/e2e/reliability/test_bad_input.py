"""Bad input over the wire is refused before any GPU work (issue 7, item 5).

Raw bytes through Daphne: oversized, unparsable and mis-encoded bodies and
out-of-range parameters get a 4xx in OpenAI's error shape naming the param
(413 for a body over MAX_REQUEST_BYTES); afterwards neither worker has seen
a prompt token, no usage record exists and no concurrency slot is held.
"""

from __future__ import annotations

import json
import time

import httpx
import pytest
from django.conf import settings

from billing.models import UsageRecord
from gpuworkers.worker import HEARTBEAT_INTERVAL
from tests.e2e.flows import MODEL

# The first test of the package also waits for the topology to start.
pytestmark = [pytest.mark.slow, pytest.mark.django_db, pytest.mark.timeout(900)]

HI = [{"role": "user", "content": "hi"}]


def body(**fields) -> bytes:
    return json.dumps({"model": MODEL, "messages": HI, **fields}).encode()


CASES = [
    # (raw body, status, param, code)
    (b'{"model": "x", "messages": [', 400, None, "invalid_json"),
    (b'{"model": "\xc3\x28", "messages": []}', 400, None, "invalid_json"),
    (b"[" * 200_000, 400, None, "invalid_json"),
    (body(messages=[{"role": "robot", "content": "x"}]), 400, "messages[0].role", None),
    (body(messages=[{"role": "user", "content": "\ud800"}]), 400, "messages[0].content", None),
    (body(n=9), 400, "n", "value_above_max_value"),
    (body(max_tokens=-1), 400, "max_tokens", "value_below_min_value"),
    (body(max_tokens=10**9), 400, "max_tokens", "integer_above_max_value"),
    (body(stop=["a", "b", "c", "d", "e"]), 400, "stop", "array_above_max_length"),
    (body(logprobs=True, top_logprobs=21), 400, "top_logprobs", "value_above_max_value"),
    (body(stream=True, temperature=3), 400, "temperature", "value_above_max_value"),
    (
        body(messages=[{"role": "user", "content": "x" * settings.DATA_UPLOAD_MAX_MEMORY_SIZE}]),
        413,
        None,
        "request_too_large",
    ),
]


def test_bad_requests_get_4xx_naming_the_param_and_reach_no_worker(live):
    before = {w: s.extra["prompt_tokens_sent"] for w, s in live.worker_stats().items()}
    records = UsageRecord.objects.filter(tenant_id=live.tenant_id).count()
    url = f"{live.base_url}/chat/completions"
    headers = {**live.headers, "Content-Type": "application/json"}
    with httpx.Client(timeout=60) as client:
        for raw, status, param, code in CASES:
            response = client.post(url, content=raw, headers=headers)
            label = raw[:60]
            assert response.status_code == status, (label, response.text)
            error = response.json()["error"]
            assert set(error) == {"message", "type", "param", "code"}, label
            assert error["type"] == "invalid_request_error", label
            assert error["param"] == param, (label, error)
            if code is not None:
                assert error["code"] == code, (label, error)
    # Two heartbeats later the stats would show anything that got through.
    time.sleep(2 * HEARTBEAT_INTERVAL + 0.2)
    after = {w: s.extra["prompt_tokens_sent"] for w, s in live.worker_stats().items()}
    assert after == before
    assert UsageRecord.objects.filter(tenant_id=live.tenant_id).count() == records
    assert live.slots_in_use() == 0
