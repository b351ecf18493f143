"""The web's /metrics behind METRICS_TOKEN (issue 32): open only in local mode without one."""

import pytest

pytestmark = pytest.mark.django_db


def test_local_mode_without_a_token_serves_the_scrape(client, settings):
    settings.METRICS_TOKEN = ""
    response = client.get("/metrics")
    assert response.status_code == 200
    assert b"django_http_requests_total_by_method_total" in response.content


def test_production_without_a_token_keeps_metrics_closed(client, settings):
    settings.METRICS_TOKEN, settings.LOCAL = "", False
    response = client.get("/metrics")
    assert response.status_code == 403
    assert b"METRICS_TOKEN" in response.content


@pytest.mark.parametrize("local", [True, False])
def test_a_token_is_required_once_set(client, settings, local):
    settings.METRICS_TOKEN, settings.LOCAL = "s3cret-token", local
    assert client.get("/metrics").status_code == 401
    wrong = client.get("/metrics", headers={"Authorization": "Bearer s3cret-tokem"})
    assert wrong.status_code == 401 and wrong["WWW-Authenticate"].startswith("Bearer")
    basic = client.get("/metrics", headers={"Authorization": "Basic s3cret-token"})
    assert basic.status_code == 401
    right = client.get("/metrics", headers={"Authorization": "Bearer s3cret-token"})
    assert right.status_code == 200 and b"# TYPE" in right.content
