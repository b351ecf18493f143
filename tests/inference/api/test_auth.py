"""API-key authentication: one 401 for every bad key, 403 for tiers without API access."""

import json

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from tenants.models import ApiKey
from tenants.services import api_key_revoke
from tests.plugins.request_path import DEMO, auth

pytestmark = pytest.mark.django_db

CHAT_BODY = json.dumps({"model": DEMO, "messages": [{"role": "user", "content": "hi"}]})


def post_chat(client, **headers):
    return client.post(
        "/v1/chat/completions", CHAT_BODY, content_type="application/json", **headers
    )


def assert_invalid_api_key(response):
    assert response.status_code == 401
    error = json.loads(response.content)["error"]
    assert (error["type"], error["code"], error["param"]) == (
        "invalid_request_error",
        "invalid_api_key",
        None,
    )
    return error


@pytest.mark.parametrize(
    "header",
    [None, "Basic dXNlcjpwdw==", "Bearer", "Bearer not-a-key", "Bearer sk-lp-00000000.wrong"],
)
def test_missing_or_invalid_key_is_401_invalid_api_key(client, demo_model, header):
    headers = {} if header is None else {"HTTP_AUTHORIZATION": header}
    assert_invalid_api_key(post_chat(client, **headers))
    assert_invalid_api_key(client.get("/v1/models", **headers))


def test_wrong_secret_for_a_real_prefix_is_401_and_never_echoes_the_key(client, api_key_factory):
    api_key, raw = api_key_factory(tier="pro")
    forged = f"{api_key.prefix}.{'A' * 43}"
    error = assert_invalid_api_key(client.get("/v1/models", **auth(forged)))
    assert forged not in error["message"]


def test_revoked_key_is_401(client, api_key_factory, demo_model):
    api_key, raw = api_key_factory(tier="pro")
    assert client.get("/v1/models", **auth(raw)).status_code == 200
    api_key_revoke(api_key=api_key)
    assert_invalid_api_key(post_chat(client, **auth(raw)))


def test_tier_without_api_access_is_403(client, api_key_factory, demo_model):
    """The free tier is console-only: a valid free key gets 403, not 401."""
    _, raw = api_key_factory(tier="free")
    response = post_chat(client, **auth(raw))
    assert response.status_code == 403
    error = json.loads(response.content)["error"]
    assert error["code"] == "api_access_denied" and "free" in error["message"]


def test_authenticated_request_touches_last_used_at(client, api_key_factory):
    api_key, raw = api_key_factory(tier="pro")
    assert api_key.last_used_at is None
    client.get("/v1/models", **auth(raw))
    assert ApiKey.objects.get(pk=api_key.pk).last_used_at is not None


def test_authentication_runs_before_body_validation(client):
    """An unauthenticated malformed request is a 401, never a 400 that leaks the schema."""
    response = client.post("/v1/chat/completions", b"{bad", content_type="application/json")
    assert_invalid_api_key(response)


def test_a_key_used_within_the_minute_is_authenticated_without_touching_it(client, api_key_factory):
    """The second request reads the key and writes nothing: no UPDATE on the
    way to the first token while last_used_at is fresh."""
    api_key, raw = api_key_factory(tier="pro")
    client.get("/v1/models", **auth(raw))
    stamp = ApiKey.objects.get(pk=api_key.pk).last_used_at
    with CaptureQueriesContext(connection) as queries:
        assert client.get("/v1/models", **auth(raw)).status_code == 200
    sql = [q["sql"] for q in queries.captured_queries]
    assert any('FROM "tenants_apikey"' in q for q in sql), sql  # the key was read here
    assert not [q for q in sql if q.startswith("UPDATE")]
    assert ApiKey.objects.get(pk=api_key.pk).last_used_at == stamp
