"""A fuzz pass over /v1 on PostgreSQL, with /healthz timed meanwhile.

Hypothesis draws hostile values (NUL, lone surrogates, odd Unicode, huge
backtracking bait, arbitrary JSON) into every slot of every endpoint's
body, plus unparsable and deeply nested bodies and odd paths. A scripted
worker answers what gets through. Every answer must be a non-5xx, every
error in OpenAI's shape; /healthz, polled on the same event loop, must stay
responsive; and afterwards the database must still be up (a refused query
is no outage). The default run is bounded (``CASES``); the slow variant
draws more cases with far larger inputs.
"""

from __future__ import annotations

import json

import pytest
from asgiref.sync import sync_to_async
from hypothesis import strategies as st

from fleet.fallback import db_marked_down
from tests.plugins.asgi_client import ASGIStream
from tests.plugins.hostile import (
    HealthzTimer,
    draw,
    dumps,
    json_values,
    nested_bytes,
    odd_text,
)
from tests.plugins.request_path import DEMO

pytestmark = [
    pytest.mark.asyncio,
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("close_db_threads"),
]

CASES = 90
# Loose: a stall of the loop (a regex holding the GIL, a synchronous fetch)
# is seconds; a busy shared CI machine is tenths.
HEALTHZ_BOUND_S = 2.0
HI = [{"role": "user", "content": "hi"}]
CHAT = "/v1/chat/completions"


def chat(**fields):
    return CHAT, {"model": DEMO, "messages": HI, "max_tokens": 2, **fields}


def tool(parameters):
    return [{"type": "function", "function": {"name": "f", "parameters": parameters}}]


SLOTS = {
    "model": lambda v: chat(model=v),
    "content": lambda v: chat(messages=[{"role": "user", "content": v}]),
    "part": lambda v: chat(messages=[{"role": "user", "content": [{"type": "text", "text": v}]}]),
    "role": lambda v: chat(messages=[{"role": v, "content": "hi"}]),
    "messages": lambda v: chat(messages=v),
    "user": lambda v: chat(user=v),
    "stop": lambda v: chat(stop=v),
    "metadata": lambda v: chat(metadata=v),
    "prompt_cache_key": lambda v: chat(prompt_cache_key=v),
    "tool_parameters": lambda v: chat(tools=tool(v)),
    "schema": lambda v: chat(
        response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": v}}
    ),
    "unknown_field": lambda v: chat(x_unknown=v),
    "completions": lambda v: ("/v1/completions", {"model": DEMO, "prompt": v, "max_tokens": 2}),
    "moderations": lambda v: ("/v1/moderations", {"input": v}),
    "responses": lambda v: (
        "/v1/responses",
        {"model": DEMO, "input": v, "max_output_tokens": 2},
    ),
    "whole_body": lambda v: (CHAT, v),
}


def cases(count: int, max_huge: int) -> list[tuple[str, str, bytes]]:
    """(method, path, body) per case."""
    value = json_values(max_huge) | odd_text(max_huge)
    posts = st.builds(
        lambda slot, v: ("POST", *_post(SLOTS[slot](v))), st.sampled_from(sorted(SLOTS)), value
    )
    # Paths arrive percent-decoded (as Daphne passes them): NUL included,
    # surrogates not (they cannot be percent-encoded UTF-8).
    path_text = odd_text(2_000)
    gets = st.builds(
        lambda where, v: ("GET", where.format(v), b""),
        st.sampled_from(["/v1/models/{}", "/v1/chat/completions/{}/events"]),
        path_text.filter(lambda s: not _has_surrogate(s) and s.strip("/")),
    )
    raw = st.builds(lambda body: ("POST", CHAT, body), st.binary(max_size=300))
    drawn = draw(st.one_of(posts, posts, posts, gets, raw), count)
    deep = [
        ("POST", CHAT, nested_bytes(depth, kind))
        for depth in (1_000, 100_000)
        for kind in ("list", "dict")
    ]
    nested_field = b'{"model": "%s", "messages": [{"role": "user", "content": "hi"}], "metadata": '
    deep.append(("POST", CHAT, nested_field % DEMO.encode() + nested_bytes(50_000, "list") + b"}"))
    return drawn + deep


def _post(target: tuple[str, object]) -> tuple[str, bytes]:
    path, body = target
    return path, dumps(body)


def _has_surrogate(text: str) -> bool:
    return any("\ud800" <= c <= "\udfff" for c in text)


async def send(method: str, path: str, body: bytes, key: str) -> tuple[int, bytes]:
    headers = {"authorization": f"Bearer {key}", "content-type": "application/json"}
    stream = ASGIStream(method, path, headers, body)
    content = await stream.read_all(timeout=120)
    return stream.status, content


def assert_openai_answer(case, status: int, content: bytes) -> None:
    assert status < 500, (case[:2], case[2][:200], status, content[:500])
    if status == 200:
        json.loads(content)
        return
    error = json.loads(content)["error"]
    assert set(error) == {"message", "type", "param", "code"}, (case[:2], content[:500])
    assert error["message"] and error["type"]


@pytest.fixture
def fuzz_key(api_key_factory, demo_model) -> str:
    # Enterprise: rates high enough that the cases reach the checks, not a 429.
    return api_key_factory(tier="enterprise")[1]


async def run_fuzz(key: str, count: int, max_huge: int) -> HealthzTimer:
    drawn = await sync_to_async(cases)(count, max_huge)
    async with HealthzTimer() as timer:
        for case in drawn:
            status, content = await send(*case, key)
            assert_openai_answer(case, status, content)
    return timer


async def assert_database_up() -> None:
    assert not db_marked_down()
    stream = ASGIStream("GET", "/readyz", {}, b"")
    checks = json.loads(await stream.read_all())["checks"]
    assert checks["database"] == "ok", checks


async def test_fuzzed_requests_get_4xx_in_openai_shape_and_never_stall(fake_worker, fuzz_key):
    fake_worker(tokens=2)
    timer = await run_fuzz(fuzz_key, CASES, max_huge=16_000)
    assert timer.polls > 0
    assert timer.worst < HEALTHZ_BOUND_S, f"/healthz took {timer.worst:.2f} s"
    await assert_database_up()


@pytest.mark.slow
async def test_fuzzed_requests_at_scale(fake_worker, fuzz_key):
    """More cases, inputs up to 200,000 characters (backtracking bait at scale)."""
    fake_worker(tokens=2)
    timer = await run_fuzz(fuzz_key, 600, max_huge=200_000)
    assert timer.worst < HEALTHZ_BOUND_S, f"/healthz took {timer.worst:.2f} s"
    await assert_database_up()
