"""Every /v1 error is OpenAI-shaped with the right status, and carries x-request-id."""

import json
import logging

import pytest

from inference.api import endpoints as inference_api
from inference.errors import (
    InsufficientQuota,
    RateLimited,
    as_api_error,
    error_param,
    validation_error_to_api_error,
)
from tests.plugins.request_path import DEMO, auth

pytestmark = pytest.mark.django_db

CHAT = "/v1/chat/completions"


def error_of(response) -> dict:
    body = json.loads(response.content)
    assert set(body) == {"error"}
    assert set(body["error"]) == {"message", "type", "param", "code"}
    assert response["x-request-id"]
    return body["error"]


@pytest.mark.parametrize(
    "loc, param",
    [
        (("body", "payload", "max_tokens"), "max_tokens"),
        (("body", "payload", "messages", 0, "role"), "messages[0].role"),
        (("body", "payload", "stop", "list[constrained-str]"), "stop"),
        (
            ("body", "payload", "messages", 2, "content", "list[TextContentPart]", 0, "type"),
            "messages[2].content",
        ),
        (("body", "payload"), None),
    ],
)
def test_error_param_names_the_field_like_openai(loc, param):
    """pydantic locs become OpenAI param paths; union member tags are dropped."""
    assert error_param(loc) == param


def test_union_errors_prefer_the_member_that_applied():
    """For stop=[5 strings] the list's length error wins over 'not a string'."""
    errors = [
        {
            "type": "string_type",
            "loc": ("body", "payload", "stop", "constrained-str"),
            "msg": "Input should be a valid string",
        },
        {
            "type": "too_long",
            "loc": ("body", "payload", "stop", "list[constrained-str]"),
            "msg": "List should have at most 4 items",
        },
    ]
    error = validation_error_to_api_error(errors)
    assert (error.status, error.param, error.code) == (400, "stop", "array_above_max_length")
    assert "at most 4" in error.message


def test_rate_limit_errors_carry_retry_after_headers():
    """429s: rate_limit_exceeded with Retry-After (s) and retry-after-ms; quota is distinct."""
    limited = RateLimited(retry_after=1.2)
    assert (limited.status, limited.code, limited.type) == (429, "rate_limit_exceeded", "requests")
    assert limited.headers == {"Retry-After": "2", "retry-after-ms": "1200"}
    quota = InsufficientQuota()
    assert (quota.status, quota.code, quota.type) == (
        429,
        "insufficient_quota",
        "insufficient_quota",
    )


def test_unexpected_exception_maps_to_logged_500(caplog):
    """Anything unexpected becomes a 500 server_error and is logged with its traceback."""
    with caplog.at_level(logging.ERROR, logger="inference.errors"):
        error = as_api_error(RuntimeError("boom"))
    assert (error.status, error.type) == (500, "server_error")
    assert "boom" not in error.message
    assert caplog.records and caplog.records[0].exc_info


@pytest.mark.parametrize(
    "body",
    [b"{not json", b"\xff\xfe{}", b'{"model": "x", "messages": [}'],
)
def test_unparsable_body_is_400_invalid_json(client, pro_key, body):
    """Invalid JSON or invalid UTF-8: 400 invalid_request_error before anything else."""
    response = client.post(CHAT, body, content_type="application/json", **auth(pro_key))
    assert response.status_code == 400
    error = error_of(response)
    assert (error["type"], error["code"]) == ("invalid_request_error", "invalid_json")


@pytest.mark.parametrize("body", [b"", b"[1, 2]", b'"text"'])
def test_body_that_is_not_an_object_is_400(client, pro_key, body):
    response = client.post(CHAT, body, content_type="application/json", **auth(pro_key))
    assert response.status_code == 400
    assert error_of(response)["code"] == "invalid_json"


def test_oversized_body_is_413(client, pro_key, settings):
    """A body over DATA_UPLOAD_MAX_MEMORY_SIZE: 413 request_too_large, in OpenAI's shape."""
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 1000
    body = json.dumps({"model": DEMO, "messages": [{"role": "user", "content": "x" * 5000}]})
    response = client.post(CHAT, body, content_type="application/json", **auth(pro_key))
    assert response.status_code == 413
    assert error_of(response)["code"] == "request_too_large"


@pytest.mark.parametrize("method", ["get", "post", "delete"])
def test_unknown_path_is_404_in_openai_shape(client, method):
    response = getattr(client, method)("/v1/no/such/thing")
    assert response.status_code == 404
    error = error_of(response)
    assert error["message"] == f"Invalid URL ({method.upper()} /v1/no/such/thing)"


def test_wrong_method_is_405_in_openai_shape(client, pro_key):
    response = client.delete("/v1/models", **auth(pro_key))
    assert response.status_code == 405
    assert error_of(response)["code"] == "method_not_allowed"
    assert response["Allow"] == "GET"


def test_unexpected_error_in_an_endpoint_is_500_server_error(client, pro_key, monkeypatch):
    """A bug in a service surfaces as OpenAI's 500, not a traceback page."""

    async def broken(**kwargs):
        raise ZeroDivisionError("division by zero")

    monkeypatch.setattr(inference_api.services, "generation_start", broken)
    body = json.dumps({"model": DEMO, "messages": [{"role": "user", "content": "hi"}]})
    response = client.post(CHAT, body, content_type="application/json", **auth(pro_key))
    assert response.status_code == 500
    error = error_of(response)
    assert (error["type"], error["param"]) == ("server_error", None)


def test_request_id_on_every_response(client, pro_key):
    """Success, 4xx, docs and non-API pages all carry x-request-id."""
    responses = [
        client.get("/v1/models", **auth(pro_key)),
        client.get("/v1/models"),
        client.get("/v1/nothing"),
        client.get("/v1/openapi.json"),
        client.get("/admin/login/"),
    ]
    ids = [r["x-request-id"] for r in responses]
    assert all(i.startswith("req_") for i in ids) and len(set(ids)) == len(ids)


@pytest.mark.parametrize(
    "incoming, echoed",
    [("abc-123.DEF:7", True), ("x" * 129, False), ("bad id", False), ("a\tb", False)],
)
def test_sane_incoming_request_id_is_echoed(client, incoming, echoed):
    response = client.get("/v1/models", HTTP_X_REQUEST_ID=incoming)
    assert (response["x-request-id"] == incoming) is echoed
    if not echoed:
        assert response["x-request-id"].startswith("req_")
