"""Hostile and malformed input is a 4xx naming the problem, and reaches no worker.

Complements test_validation.py (one bad parameter at a time) with input a
careless or hostile client sends: broken encodings, pathological JSON,
values at and past every limit, odd resume cursors. A scripted worker is on
the bus, so anything that got through would show up in ``worker.received``.
"""

from __future__ import annotations

import json

import pytest

from tests.plugins.request_path import DEMO, auth

pytestmark = pytest.mark.django_db(transaction=True)

CHAT = "/v1/chat/completions"
HI = [{"role": "user", "content": "hi"}]


def post_raw(client, key, body: bytes):
    return client.post(CHAT, body, content_type="application/json", **auth(key))


def post(client, key, **fields):
    return post_raw(client, key, json.dumps({"model": DEMO, "messages": HI, **fields}).encode())


def error_of(response) -> dict:
    body = json.loads(response.content)
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}
    return body["error"]


@pytest.fixture
def worker(fake_worker):
    worker = fake_worker(tokens=2)
    yield worker
    assert worker.received == [], "a bad request reached the worker"


@pytest.mark.parametrize(
    "body, code",
    [
        (b'{"model": "x", "messages": [', "invalid_json"),
        (b'{"model": "\xff\xfe", "messages": []}', "invalid_json"),
        (b"[" * 100_000 + b"]" * 100_000, "invalid_json"),
        (b'{"a": ' * 50_000 + b"1" + b"}" * 50_000, "invalid_json"),
        (b"", "invalid_json"),
        (b"null", "invalid_json"),
        (b'"a string"', "invalid_json"),
    ],
)
def test_unparsable_or_pathological_bodies_are_400(client, pro_key, worker, body, code):
    """Broken JSON, bad UTF-8, nesting deep enough to blow a recursive parser."""
    response = post_raw(client, pro_key, body)
    assert response.status_code == 400, response.content
    error = error_of(response)
    assert (error["type"], error["code"]) == ("invalid_request_error", code)


@pytest.mark.parametrize(
    "fields, param",
    [
        (
            {"messages": [{"role": "user", "content": "\ud800 lone surrogate"}]},
            "messages[0].content",
        ),
        ({"messages": [{"role": "robot", "content": "hi"}]}, "messages[0].role"),
        (
            {"messages": [{"role": "user", "content": "hi", "tool_calls": []}]},
            "messages[0].tool_calls",
        ),
        ({"messages": "hi"}, "messages"),
        ({"n": 9}, "n"),
        ({"n": 10**30}, "n"),
        ({"max_tokens": -1}, "max_tokens"),
        ({"max_tokens": 2**63}, "max_tokens"),
        ({"max_tokens": 1.5}, "max_tokens"),
        ({"stop": ["a"] * 5}, "stop"),
        ({"stop": "x" * 100_000}, "stop"),
        # Unstorable strings are found before field validation, at their exact path.
        ({"stop": ["ok", "\udfff"]}, "stop[1]"),
        (
            {"messages": [{"role": "user", "content": [{"type": "text", "text": "\udc80"}]}]},
            "messages[0].content[0].text",
        ),
        ({"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
        ({"logprobs": True, "top_logprobs": -1}, "top_logprobs"),
        ({"temperature": float("nan")}, "temperature"),
        ({"temperature": float("inf")}, "temperature"),
        ({"top_p": float("nan")}, "top_p"),
        ({"seed": -(2**63) - 1}, "seed"),
        ({"model": "x" * 1000}, "model"),
        ({"user": "u" * 1000}, "user"),
    ],
)
def test_out_of_range_values_are_400_naming_the_param(client, pro_key, worker, fields, param):
    response = post(client, pro_key, **fields)
    assert response.status_code == 400, response.content
    error = error_of(response)
    assert error["param"] == param and error["type"] == "invalid_request_error"


def test_oversized_body_is_413_before_parsing(client, pro_key, worker, settings):
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 4096
    body = json.dumps({"model": DEMO, "messages": [{"role": "user", "content": "x" * 8192}]})
    response = post_raw(client, pro_key, body.encode())
    assert response.status_code == 413
    assert error_of(response)["code"] == "request_too_large"


@pytest.mark.parametrize(
    "query, headers",
    [
        ("?after=99999999999999999999999", {}),
        ("?after=-5", {}),
        ("", {"HTTP_LAST_EVENT_ID": "9" * 5000}),
        ("", {"HTTP_LAST_EVENT_ID": "1-2"}),
    ],
)
def test_resume_cursors_out_of_range_are_4xx(client, pro_key, worker, query, headers):
    """A cursor past any stream, negative or malformed: never a 5xx."""
    response = client.get(f"{CHAT}/chatcmpl-doesnotexist/events{query}", **auth(pro_key), **headers)
    assert response.status_code in (400, 404), response.content
    error_of(response)


@pytest.mark.parametrize("response_id", ["a" * 5000, "with space", "x:y*?[]"])
def test_odd_response_ids_are_404(client, pro_key, worker, response_id):
    response = client.get(f"{CHAT}/{response_id}/events", **auth(pro_key))
    assert response.status_code == 404, response.content
    assert error_of(response)["code"] == "not_found"
