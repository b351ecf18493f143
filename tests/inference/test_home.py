"""The landing page lists the served models and links to the API docs."""

import pytest

pytestmark = pytest.mark.django_db


def test_home_lists_models_and_links(client, demo_model):
    response = client.get("/")
    assert response.status_code == 200
    body = response.content.decode()
    assert "smollm2-135m-instruct" in body
    assert 'href="/v1/docs"' in body
