"""A client that disconnects mid-stream costs nothing more (issue 7, item 1).

Against Daphne + gpuworker processes + PostgreSQL + Redis: the serving
worker's heartbeat stats show the request running with KV blocks in use;
once the SSE client closes its connection the request is aborted on the
worker, its blocks are free, the worker generated no token for it after the
abort (its token counter moved by exactly the usage record's completion
tokens), the usage record says ``cancelled``, and the tenant's concurrency
slot is back.
"""

from __future__ import annotations

import time

import httpx
import pytest

from billing.models import UsageRecord
from tests.e2e.reliability.sse import chat_body, frames, response_id_of, tokens_in

# The first test of the package also waits for the topology to start.
pytestmark = [pytest.mark.slow, pytest.mark.django_db, pytest.mark.timeout(900)]


def test_sse_disconnect_aborts_on_the_worker_frees_kv_and_settles(live):
    """Close after a few tokens: KV freed, nothing generated after, usage and slot settled."""
    # Idle, and the token counters steady for longer than a heartbeat: an
    # earlier test's request still finishing would otherwise count as this
    # one's tokens.
    seen: dict = {}

    def quiet():
        stats = live.worker_stats()
        counts = {w: (s.running, s.waiting, s.extra["generated_tokens"]) for w, s in stats.items()}
        if not stats or any(r or q for r, q, _ in counts.values()) or counts != seen.get("counts"):
            seen.update(counts=counts, since=time.monotonic())
            return None
        return stats if time.monotonic() - seen["since"] > 2.5 else None

    idle = live.wait_for(quiet, 60, "the workers were idle with steady token counters")
    assert all(w.kv_blocks_used == 0 for w in idle.values())

    streamed = 0
    with httpx.Client(timeout=60) as client:
        url = f"{live.base_url}/chat/completions"
        with client.stream("POST", url, json=chat_body(), headers=live.headers) as response:
            assert response.status_code == 200, response.read()
            reader = frames(response)
            response_id = response_id_of(next(reader))
            for frame in reader:
                streamed += tokens_in(frame)
                if streamed >= 3:
                    break
            # While it streams, its worker reports it with KV blocks held and
            # the tenant holds one concurrency slot.
            busy = live.wait_for(
                lambda: [s for s in live.worker_stats().values() if s.running == 1],
                10,
                "a worker reported the request running",
            )[0]
            assert busy.kv_blocks_used > 0
            assert live.slots_in_use() == 1
        # Leaving the block closes the connection with the stream unfinished.

    record = live.wait_for(
        lambda: UsageRecord.objects.filter(response_id=response_id).first(),
        15,
        "the usage record was written",
    )
    assert (record.status, record.finish_reason) == ("cancelled", "abort")
    assert record.worker_id == busy.worker_id
    assert streamed <= record.completion_tokens < 1500
    freed = live.wait_for(
        lambda: (s := live.worker_stats()[busy.worker_id]).running == 0 and s,
        10,
        "the worker dropped the request",
    )
    assert freed.kv_blocks_used == 0 and freed.waiting == 0
    # Not one token was generated for it after the abort landed: the KV
    # blocks were released before the engine's next iteration.
    generated = freed.extra["generated_tokens"] - idle[busy.worker_id].extra["generated_tokens"]
    assert generated == record.completion_tokens
    assert live.slots_in_use() == 0
