"""Redis restarted under Daphne and the gpuworkers (issue 7, item 4).

The topology's Redis is a private redis-server: killing it mid-stream
ends the in-flight SSE stream with an error frame (``bus_unavailable``) and
``[DONE]``; while it is down a new request is a 503 in OpenAI's error shape;
once it is back (empty: no persistence) the workers re-register by
themselves and requests complete again, with no web or worker process
restarted.
"""

from __future__ import annotations

import time

import httpx
import pytest

from billing.models import UsageRecord
from tests.e2e.reliability.sse import chat_body, frames, response_id_of, tokens_in

# The first test of the package also waits for the topology to start.
pytestmark = [pytest.mark.slow, pytest.mark.django_db, pytest.mark.timeout(900)]


def short_request(live, **overrides) -> httpx.Response:
    body = {**chat_body(max_tokens=4), "stream": False, "stream_options": None, **overrides}
    return httpx.post(
        f"{live.base_url}/chat/completions", json=body, headers=live.headers, timeout=60
    )


def test_redis_restart_fails_in_flight_streams_503s_then_recovers(live):
    pids = {name: proc.pid for name, proc in [("web", live.web), *live.workers.items()]}
    alive = [w for w, proc in live.workers.items() if proc.poll() is None]
    with httpx.Client(timeout=httpx.Timeout(60, read=20)) as client:
        url = f"{live.base_url}/chat/completions"
        with client.stream("POST", url, json=chat_body(), headers=live.headers) as response:
            assert response.status_code == 200
            reader = frames(response)
            seen = [next(reader)]
            while sum(tokens_in(f) for f in seen) < 3:
                seen.append(next(reader))
            response_id = response_id_of(seen[0])
            live.redis_server.kill()
            killed_at = time.monotonic()
            rest = list(reader)
            ended_after = time.monotonic() - killed_at

    assert ended_after < 10, ended_after
    assert rest[-1].done and sum(f.done for f in rest) == 1
    assert rest[-2].error["code"] == "bus_unavailable"
    assert all(f.error is None for f in rest[:-2])

    # Down: new requests are refused at once, in OpenAI's shape.
    for stream in (False, True):
        refused = short_request(live, stream=stream, stream_options=None)
        assert refused.status_code == 503, refused.text
        error = refused.json()["error"]
        assert set(error) == {"message", "type", "param", "code"}
        assert (error["type"], error["code"]) == ("server_error", "bus_unavailable")

    live.redis_server.start()
    # The workers re-register with their next heartbeat; nothing restarts.
    live.wait_for(
        lambda: set(live.worker_stats()) == set(alive), 15, "the workers were back in the table"
    )
    # Every request after the restart works, not merely the first: each
    # pooled connection to the old server is dead and must be replaced.
    for _ in range(4):
        recovered = short_request(live)
        assert recovered.status_code == 200, recovered.text
        assert recovered.json()["usage"]["completion_tokens"] == 4
        replay = httpx.get(
            f"{live.base_url}/chat/completions/{recovered.json()['id']}/events",
            headers=live.headers,
            timeout=30,
        )
        assert replay.status_code == 200, replay.text
        assert replay.text.endswith("data: [DONE]\n\n")
    assert all(proc.poll() is None for proc in [live.web, *(live.workers[w] for w in alive)])
    assert {name: proc.pid for name, proc in [("web", live.web), *live.workers.items()]} == pids

    # The interrupted response was billed as failed with what was generated.
    record = UsageRecord.objects.get(response_id=response_id)
    assert record.status == "failed"
    assert record.completion_tokens >= sum(tokens_in(f) for f in seen)
