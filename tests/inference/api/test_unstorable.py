"""NUL bytes and lone surrogates: refused at the edge, never "database down".

PostgreSQL refuses NUL in text with DataError. The API refuses such strings
(and unpaired surrogates) anywhere in a body with a 400 naming the exact
param, before any lookup; and a query the database refuses no longer trips
the outage breaker (``fleet.fallback``), which only connection errors do.
"""

from __future__ import annotations

import json

import pytest
from django.db import InterfaceError, OperationalError

import fleet.fallback
from fleet.fallback import DB_UNREACHABLE, db_marked_down
from fleet.selectors import catalog_model_get
from tests.plugins.request_path import DEMO, auth

pytestmark = pytest.mark.django_db(transaction=True)

CHAT = "/v1/chat/completions"
HI = [{"role": "user", "content": "hi"}]


@pytest.fixture(autouse=True)
def breaker_closed(monkeypatch):
    monkeypatch.setattr(fleet.fallback, "_db_down_until", 0.0)


def post(client, key, path=CHAT, **fields):
    body = json.dumps({"model": DEMO, "messages": HI, **fields})
    return client.post(path, body, content_type="application/json", **auth(key))


def error_of(response) -> dict:
    body = json.loads(response.content)
    assert set(body["error"]) == {"message", "type", "param", "code"}
    return body["error"]


def test_nul_in_model_is_400_and_the_database_stays_up(
    client, pro_key, api_key_factory, fake_worker
):
    """The issue's probe: NUL in model. Then /readyz reports the database up
    and a key never seen before (not in the auth cache) still authenticates."""
    worker = fake_worker(tokens=2)
    response = post(client, pro_key, model="smollm2\x00")
    assert response.status_code == 400, response.content
    error = error_of(response)
    assert (error["param"], error["type"]) == ("model", "invalid_request_error")
    assert "NUL" in error["message"]
    assert not db_marked_down()
    ready = json.loads(client.get("/readyz").content)
    assert ready["checks"]["database"] == "ok"
    _, cold_key = api_key_factory(tier="pro")
    models = client.get("/v1/models", **auth(cold_key))
    assert models.status_code == 200, models.content
    assert worker.received == []


@pytest.mark.parametrize(
    "fields, param",
    [
        ({"messages": [{"role": "user", "content": "a\x00b"}]}, "messages[0].content"),
        ({"user": "\x00"}, "user"),
        ({"metadata": {"k": "v\x00"}}, "metadata.k"),
        ({"metadata": {"k\x00": "v"}}, "metadata"),
        ({"prompt_cache_key": "\ud800"}, "prompt_cache_key"),
        (
            {
                "tools": [
                    {
                        "type": "function",
                        "function": {
                            "name": "f",
                            "parameters": {"type": "object", "description": "x\x00"},
                        },
                    }
                ]
            },
            "tools[0].function.parameters.description",
        ),
        ({"no_such_field": "\x00"}, "no_such_field"),
    ],
)
def test_unstorable_strings_anywhere_are_400_naming_the_param(
    client, pro_key, fake_worker, fields, param
):
    worker = fake_worker(tokens=2)
    response = post(client, pro_key, **fields)
    assert response.status_code == 400, response.content
    assert error_of(response)["param"] == param
    assert worker.received == [] and not db_marked_down()


@pytest.mark.parametrize(
    "path, body",
    [
        ("/v1/completions", {"model": DEMO, "prompt": "a\x00"}),
        ("/v1/moderations", {"input": ["ok", "\x00"]}),
        ("/v1/responses", {"model": DEMO, "input": "\udc00"}),
    ],
)
def test_every_endpoint_refuses_unstorable_strings(client, pro_key, path, body):
    response = client.post(path, json.dumps(body), content_type="application/json", **auth(pro_key))
    assert response.status_code == 400, response.content
    assert error_of(response)["param"] in ("prompt", "input[1]", "input")


def test_nul_in_a_model_path_is_404_not_500(client, pro_key):
    response = client.get("/v1/models/demo%00x", **auth(pro_key))
    assert response.status_code == 404, response.content
    assert error_of(response)["code"] == "model_not_found"
    assert not db_marked_down()


def test_a_query_the_database_refuses_does_not_mark_it_down(tiers):
    """DataError (NUL in a lookup) is no outage: None, and the breaker stays closed."""
    assert catalog_model_get(name="x\x00y", tier=tiers["pro"]) is None
    assert not db_marked_down()


def test_a_key_with_nul_is_401_and_the_database_stays_up(client, pro_key):
    prefix, _, secret = pro_key.partition(".")
    response = client.get("/v1/models", HTTP_AUTHORIZATION=f"Bearer {prefix}\x00.{secret}")
    assert response.status_code == 401, response.content
    assert not db_marked_down()


def test_only_connection_errors_are_outages():
    assert issubclass(OperationalError, DB_UNREACHABLE)
    assert issubclass(InterfaceError, DB_UNREACHABLE)
    from django.db import DataError, IntegrityError, ProgrammingError

    for refused in (DataError, IntegrityError, ProgrammingError):
        assert not issubclass(refused, DB_UNREACHABLE)
