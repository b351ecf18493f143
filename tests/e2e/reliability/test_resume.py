"""Resuming an SSE stream with Last-Event-ID (issue 7, item 3).

Against the live topology: a second connection that resumes after event k
gets exactly the original stream's frames after k (byte for byte: no gaps,
no repeats), whether the response is still generating or already ended;
a client that lost its connection reads the rest of the story, ids rising
by one up to the terminal event.
"""

from __future__ import annotations

import httpx
import pytest

from tests.e2e.reliability.sse import Frame, chat_body, frames, response_id_of, resumable_headers

# The first test of the package also waits for the topology to start.
pytestmark = [pytest.mark.slow, pytest.mark.django_db, pytest.mark.timeout(900)]


def raw_frames(body: list[Frame]) -> list[tuple[int | None, str]]:
    return [(f.id, f.data) for f in body]


def resume(client: httpx.Client, live, response_id: str, last_event_id: int) -> list[Frame]:
    url = f"{live.base_url}/chat/completions/{response_id}/events"
    headers = {**live.headers, "Last-Event-ID": str(last_event_id)}
    with client.stream("GET", url, headers=headers) as response:
        assert response.status_code == 200, response.read()
        return list(frames(response))


def after(original: list[Frame], seq: int) -> list[Frame]:
    """The frames a resume after ``seq`` must return: those past the last
    frame of the events up to ``seq`` (event 1, created, has none)."""
    cut = max((i for i, f in enumerate(original) if f.id is not None and f.id <= seq), default=-1)
    return original[cut + 1 :]


def test_resume_while_streaming_and_after_the_end_returns_exactly_the_rest(live):
    with httpx.Client(timeout=120) as client:
        url = f"{live.base_url}/chat/completions"
        with client.stream(
            "POST", url, json=chat_body(max_tokens=24), headers=resumable_headers(live)
        ) as response:
            assert response.status_code == 200
            reader = frames(response)
            original = [next(reader)]
            while original[-1].id is None or original[-1].id < 4:
                original.append(next(reader))
            response_id = response_id_of(original[0])
            # A second connection joins mid-response, after event 3.
            joined = resume(client, live, response_id, 3)
            original.extend(reader)
        assert original[-1].done and original[-2].json()["usage"]["completion_tokens"] == 24
        assert raw_frames(joined) == raw_frames(after(original, 3))

        ids = [f.id for f in original if f.id is not None]
        # Event 1 (created) writes no frame: the role chunk goes with event 2.
        assert ids == list(range(2, ids[-1] + 1))
        # After the end: every resume point gives exactly the frames after it.
        for seq in (1, 2, ids[len(ids) // 2], ids[-2]):
            assert raw_frames(resume(client, live, response_id, seq)) == raw_frames(
                after(original, seq)
            ), seq
        # From the start (no Last-Event-ID is after 0): the whole stream.
        assert raw_frames(resume(client, live, response_id, 0)) == raw_frames(original)


def test_resume_after_a_dropped_connection_reads_the_rest_to_one_ending(live):
    """The dropped stream was aborted; the resume shows what was generated, then the end."""
    with httpx.Client(timeout=120) as client:
        url = f"{live.base_url}/chat/completions"
        with client.stream(
            "POST", url, json=chat_body(), headers=resumable_headers(live)
        ) as response:
            reader = frames(response)
            seen = [next(reader)]
            while seen[-1].id is None or seen[-1].id < 3:
                seen.append(next(reader))
        response_id = response_id_of(seen[0])
        rest = resume(client, live, response_id, 3)
    ids = [f.id for f in rest if f.id is not None]
    assert ids == list(range(4, 4 + len(ids)))
    assert rest[-1].done and sum(f.done for f in rest) == 1
    # Exactly one ending: the cancellation the disconnect caused.
    errors = [f.error for f in rest if f.error]
    assert len(errors) == 1 and errors[0]["code"] == "cancelled"
    assert all(not f.error for f in rest[:-2])
