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


def test_the_metrics_port_serves_the_same_series_without_token_or_host_check(settings):
    """WEB_METRICS_PORT: what a private-network scraper reads by address."""
    import urllib.request

    from config.startup import metrics_port_start
    from tests.plugins.topology import free_port

    settings.WEB_METRICS_PORT, settings.WEB_METRICS_HOST = free_port(), "127.0.0.1"
    settings.METRICS_TOKEN, settings.LOCAL = "s3cret-token", False
    port = metrics_port_start()
    assert port == settings.WEB_METRICS_PORT
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/metrics", headers={"Host": "10.1.2.3"}
    )
    with urllib.request.urlopen(request, timeout=5) as response:
        assert response.status == 200
        assert b"django_http_requests_total_by_method_total" in response.read()


def test_no_metrics_port_unless_set(settings):
    from config.startup import metrics_port_start

    settings.WEB_METRICS_PORT = 0
    assert metrics_port_start() is None
