"""SIGTERM on a web (Daphne) process (issue 17): drain, then exit 0.

A Daphne of this module's own, on the package's Redis and workers. SIGTERM
mid-stream: the stream goes on to its normal ending (a finish_reason, one
``[DONE]``, no error frame), a new request meanwhile gets 503
``server_draining`` with Retry-After, the usage record bills exactly the
tokens the client received, and the process exits 0. With a short
``WEB_DRAIN_SECONDS`` a stream still open at the deadline ends with one
``server_shutdown`` error frame and ``[DONE]``; its usage is still recorded
and its generation aborted (the tenant's slot is released).
"""

from __future__ import annotations

import signal
import sys

import httpx
import pytest

from billing.models import UsageRecord
from tests.e2e.reliability.sse import chat_body, frames, response_id_of, tokens_in
from tests.plugins import topology as e2e

pytestmark = [pytest.mark.slow, pytest.mark.django_db, pytest.mark.timeout(900)]


def start_web(live, tmp_path, drain_seconds: int):
    procs = e2e.Processes(tmp_path)
    env = e2e.base_env(
        DATABASE_URL=e2e.test_db_url(),
        REDIS_URL=live.redis_url,
        RATE_LIMIT_PREFIX=live.rate_limit_prefix,
        WEB_DRAIN_SECONDS=str(drain_seconds),
    )
    port = e2e.free_port()
    daphne = [sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port)]
    web = procs.start("daphne", [*daphne, "config.asgi:application"], env)
    base_url = f"http://127.0.0.1:{port}/v1"
    e2e.wait_for_http(base_url, procs)
    return procs, web, base_url


def stream_then_sigterm(client, live, base_url, web, body):
    """Open a stream, read three tokens, SIGTERM the web process; the open reader."""
    response = client.send(
        client.build_request(
            "POST", f"{base_url}/chat/completions", json=body, headers=live.headers
        ),
        stream=True,
    )
    assert response.status_code == 200
    reader = frames(response)
    seen = [next(reader)]
    streamed = 0
    while streamed < 3:
        seen.append(next(reader))
        streamed += tokens_in(seen[-1])
    web.send_signal(signal.SIGTERM)
    return response, reader, seen


def test_sigterm_lets_the_open_stream_finish_and_refuses_new_requests(live, tmp_path):
    procs, web, base_url = start_web(live, tmp_path, drain_seconds=300)
    try:
        # Long enough to still be streaming when the new request comes.
        body = chat_body(max_tokens=120, min_tokens=120)
        with httpx.Client(timeout=httpx.Timeout(60, read=30)) as client:
            response, reader, seen = stream_then_sigterm(client, live, base_url, web, body)
            refused = client.post(
                f"{base_url}/chat/completions", json=chat_body(), headers=live.headers
            )
            rest = list(reader)
            response.close()
        assert refused.status_code == 503
        assert refused.json()["error"]["code"] == "server_draining"
        assert refused.headers["retry-after"] == "1"
        every = seen + rest
        assert every[-1].done and sum(f.done for f in every) == 1
        assert all(f.error is None for f in every)
        finishes = [
            c["finish_reason"]
            for f in every[:-1]
            for c in f.json()["choices"]
            if c.get("finish_reason")
        ]
        assert finishes == ["length"]
        streamed = sum(tokens_in(f) for f in every)
        assert streamed == 120
        assert web.wait(60) == 0, procs.output()
        record = UsageRecord.objects.get(response_id=response_id_of(seen[0]))
        assert record.status == "completed" and record.completion_tokens == streamed
    finally:
        procs.stop()


def test_streams_open_at_the_drain_deadline_end_with_server_shutdown(live, tmp_path):
    procs, web, base_url = start_web(live, tmp_path, drain_seconds=1)
    try:
        with httpx.Client(timeout=httpx.Timeout(60, read=30)) as client:
            response, reader, seen = stream_then_sigterm(client, live, base_url, web, chat_body())
            rest = list(reader)
            response.close()
        assert rest[-1].done and sum(f.done for f in rest) == 1
        assert [f.error["code"] for f in rest if f.error] == ["server_shutdown"]
        assert rest[-2].error is not None
        assert web.wait(60) == 0, procs.output()
        response_id = response_id_of(seen[0])
        # Written by the draining process from the worker's cancelled ending,
        # or by the settler from the worker's usage entry.
        record = live.wait_for(
            lambda: UsageRecord.objects.filter(response_id=response_id).first(),
            30,
            "the usage record was written",
        )
        assert record.status == "cancelled"
        assert record.completion_tokens >= sum(tokens_in(f) for f in seen + rest)
        assert live.wait_for(lambda: live.slots_in_use() == 0, 30, "the slot was released")
        assert live.wait_for(
            lambda: all(not s.running for s in live.worker_stats().values()),
            30,
            "the generation was aborted",
        )
    finally:
        procs.stop()
