"""A key's expiry and model allow-list, as the API applies them."""

import json
from datetime import timedelta

import pytest
from django.utils import timezone

from fleet.services import served_model_register
from tenants.models import ApiKey
from tests.plugins.request_path import DEMO, auth

pytestmark = pytest.mark.django_db


@pytest.fixture
def two_models(tiers, demo_model):
    served_model_register(name="second", context_length=4096)


def test_models_outside_the_allow_list_are_unknown_to_the_key(client, api_key_factory, two_models):
    """/v1/models lists only the allowed models; the others are 404 model_not_found,
    for retrieval and for completions alike."""
    _, raw = api_key_factory(tier="pro", allowed_models=["second"])
    listed = json.loads(client.get("/v1/models", **auth(raw)).content)["data"]
    assert [m["id"] for m in listed] == ["second"]
    assert client.get(f"/v1/models/{DEMO}", **auth(raw)).status_code == 404
    body = {"model": DEMO, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    response = client.post(
        "/v1/chat/completions", json.dumps(body), content_type="application/json", **auth(raw)
    )
    assert response.status_code == 404
    assert json.loads(response.content)["error"]["code"] == "model_not_found"


def test_a_key_without_allow_list_reaches_every_model_of_its_tier(
    client, api_key_factory, two_models
):
    _, raw = api_key_factory(tier="pro")
    listed = json.loads(client.get("/v1/models", **auth(raw)).content)["data"]
    assert {m["id"] for m in listed} == {"second", DEMO}


def test_an_expired_key_is_401(client, api_key_factory, demo_model):
    api_key, raw = api_key_factory(tier="pro", expires_at=timezone.now() + timedelta(hours=1))
    assert client.get("/v1/models", **auth(raw)).status_code == 200
    ApiKey.objects.filter(pk=api_key.pk).update(expires_at=timezone.now() - timedelta(seconds=1))
    response = client.get("/v1/models", **auth(raw))
    assert response.status_code == 401
    assert json.loads(response.content)["error"]["code"] == "invalid_api_key"
