"""The model catalog per tier, tenant isolation, and the OpenAPI docs."""

import json
import re
from pathlib import Path

import pytest
from django.contrib.staticfiles import finders

from billing.selectors import usage_get, usage_list
from fleet.models import ServedModel
from fleet.selectors import served_model_get
from fleet.services import served_model_register
from tests.plugins.request_path import DEMO, auth
from tests.usage_records import record_usage

pytestmark = pytest.mark.django_db


@pytest.fixture
def catalog(tiers, demo_model):
    """demo (all tiers), pro-only, enterprise-only, and an inactive model."""
    served_model_register(name="pro-only", context_length=4096, tiers=[tiers["pro"]])
    served_model_register(name="enterprise-only", context_length=4096, tiers=[tiers["enterprise"]])
    retired = served_model_register(name="retired", context_length=4096)
    ServedModel.objects.filter(pk=retired.pk).update(is_active=False)


def model_ids(client, key) -> list[str]:
    response = client.get("/v1/models", **auth(key))
    assert response.status_code == 200
    body = json.loads(response.content)
    assert body["object"] == "list"
    assert all(m["object"] == "model" and m["owned_by"] for m in body["data"])
    return [m["id"] for m in body["data"]]


def test_models_list_is_filtered_by_the_keys_tier(client, api_key_factory, catalog):
    pro = api_key_factory(tier="pro")[1]
    enterprise = api_key_factory(tier="enterprise")[1]
    assert model_ids(client, pro) == ["pro-only", DEMO]
    assert model_ids(client, enterprise) == ["enterprise-only", DEMO]


def test_retrieve_model_answers_404_for_models_of_other_tiers(client, api_key_factory, catalog):
    pro = api_key_factory(tier="pro")[1]
    ok = client.get("/v1/models/pro-only", **auth(pro))
    assert ok.status_code == 200 and json.loads(ok.content)["id"] == "pro-only"
    for name in ("enterprise-only", "retired", "no-such-model"):
        response = client.get(f"/v1/models/{name}", **auth(pro))
        assert response.status_code == 404
        assert json.loads(response.content)["error"]["code"] == "model_not_found"


def test_tenant_cannot_use_a_model_restricted_to_another_tenants_tier(
    client, api_key_factory, catalog, memory_bus
):
    """Tenant A (pro) asking for tenant B's enterprise-only model: 404 model_not_found,
    with the same message as for a model that does not exist."""
    key_a = api_key_factory(tier="pro")[1]
    key_b = api_key_factory(tier="enterprise")[1]
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}

    def chat(key, model):
        return client.post(
            "/v1/chat/completions",
            json.dumps({**body, "model": model}),
            content_type="application/json",
            **auth(key),
        )

    restricted = json.loads(chat(key_a, "enterprise-only").content)["error"]
    unknown = json.loads(chat(key_a, "does-not-exist").content)["error"]
    assert restricted["code"] == unknown["code"] == "model_not_found"
    assert restricted["message"].replace("enterprise-only", "M") == unknown["message"].replace(
        "does-not-exist", "M"
    )
    assert chat(key_a, "enterprise-only").status_code == 404
    # B's key passes the catalog check (then 503: no worker in this test).
    assert chat(key_b, "enterprise-only").status_code == 503


def test_served_model_get_hides_other_tiers_and_inactive_models(tiers, catalog):
    assert served_model_get(name="enterprise-only", tier=tiers["enterprise"]) is not None
    assert served_model_get(name="enterprise-only", tier=tiers["pro"]) is None
    assert served_model_get(name="retired", tier=tiers["pro"]) is None


def test_tenant_cannot_read_another_tenants_usage(tenant_factory):
    """Usage reads are scoped: A sees none of B's records, even by response id."""
    tenant_a, tenant_b = tenant_factory(tier="pro"), tenant_factory(tier="enterprise")
    record_usage(
        response_id="chatcmpl-b1",
        tenant_id=tenant_b.pk,
        model=DEMO,
        source="api",
        status="completed",
        finish_reason="stop",
        prompt_tokens=5,
        cached_tokens=0,
        completion_tokens=3,
        queue_time_ms=0,
        ttft_ms=1,
        duration_ms=2,
    )
    assert usage_get(tenant=tenant_b, response_id="chatcmpl-b1") is not None
    assert usage_get(tenant=tenant_a, response_id="chatcmpl-b1") is None
    assert list(usage_list(tenant=tenant_a)) == []


def test_openapi_schema_and_docs_are_served(client):
    schema = client.get("/v1/openapi.json")
    assert schema.status_code == 200
    spec = json.loads(schema.content)
    assert {
        "/v1/models",
        "/v1/chat/completions",
        "/v1/chat/completions/{response_id}/events",
    } <= set(spec["paths"])
    request_schema = spec["components"]["schemas"]["ChatCompletionRequest"]
    assert request_schema["additionalProperties"] is False
    assert request_schema["properties"]["n"]["anyOf"][0]["maximum"] == 8
    responses = spec["paths"]["/v1/chat/completions"]["post"]["responses"]
    assert {"application/json", "text/event-stream"} <= set(responses["200"]["content"])
    assert "ErrorResponse" in json.dumps(responses["400"])
    assert any(s.get("scheme") == "bearer" for s in spec["components"]["securitySchemes"].values())
    docs = client.get("/v1/docs")
    assert docs.status_code == 200 and b"openapi.json" in docs.content


def test_swagger_ui_is_served_from_static_not_a_cdn(client):
    """/v1/docs works offline: its script and styles are this site's static files."""
    body = client.get("/v1/docs").content.decode()
    assert "cdn." not in body and "unpkg" not in body
    assets = re.findall(r'(?:src|href)="(/static/ninja/[^"]+)"', body)
    assert {"/static/ninja/swagger-ui-bundle.js", "/static/ninja/swagger-ui.css"} <= set(assets)
    for asset in assets:
        # What config.asgi serves (and collectstatic collects) under /static/.
        path = finders.find(asset.removeprefix("/static/"))
        assert path and Path(path).stat().st_size > 1000, asset


def test_model_entries_carry_context_length_and_features(client, api_key_factory, catalog):
    """max_model_len is the catalog's context length; features come from
    inference.api.capabilities: tools where the model's template can render them."""
    pro = ServedModel.objects.get(name="pro-only")
    ServedModel.objects.filter(pk=pro.pk).update(path="/nonexistent/model")
    key = api_key_factory(tier="pro")[1]
    body = json.loads(client.get("/v1/models", **auth(key)).content)
    entries = {m["id"]: m for m in body["data"]}
    assert entries[DEMO]["max_model_len"] == 8192 and entries["pro-only"]["max_model_len"] == 4096
    # The demo model's ChatML template takes our tools template.
    assert entries[DEMO]["features"] == [
        "chat",
        "completions",
        "responses",
        "logprobs",
        "json_schema",
        "tools",
    ]
    # A model whose files are not on this host promises no tools.
    one = json.loads(client.get("/v1/models/pro-only", **auth(key)).content)
    assert "tools" not in one["features"] and one["max_model_len"] == 4096
