"""Roles on the keys page: admins create, revoke and limit; members see their own."""

from datetime import UTC, datetime

import pytest

from tenants.models import ApiKey

pytestmark = pytest.mark.django_db


@pytest.fixture
def team(user_factory, tenant_factory):
    tenant = tenant_factory()
    return {
        "admin": user_factory(tenant=tenant, role="admin"),
        "alice": user_factory(tenant=tenant),
        "bob": user_factory(tenant=tenant),
    }


def test_a_member_cannot_revoke_another_members_key(client, team, api_key_factory):
    tenant = team["alice"].membership.tenant
    bobs, _ = api_key_factory(tenant=tenant, owner=team["bob"])
    client.force_login(team["alice"])
    assert client.post(f"/api-keys/{bobs.pk}/revoke/").status_code == 403
    bobs.refresh_from_db()
    assert bobs.revoked_at is None


def test_a_member_neither_creates_nor_limits_keys(client, team, api_key_factory):
    tenant = team["alice"].membership.tenant
    own, _ = api_key_factory(tenant=tenant, owner=team["alice"])
    client.force_login(team["alice"])
    assert client.post("/api-keys/", {"name": "sneaky"}).status_code == 403
    assert not ApiKey.objects.filter(name="sneaky").exists()
    assert client.post(f"/api-keys/{own.pk}/revoke/").status_code == 403
    limits = client.post(f"/team/keys/{own.pk}/limits/", {"rpm_limit": "1", "tpm_limit": ""})
    assert limits.status_code == 403
    own.refresh_from_db()
    assert own.revoked_at is None and own.rpm_limit is None


def test_a_member_sees_only_their_own_keys_with_last_use(client, team, api_key_factory):
    tenant = team["alice"].membership.tenant
    own, _ = api_key_factory(tenant=tenant, owner=team["alice"])
    bobs, _ = api_key_factory(tenant=tenant, owner=team["bob"])
    shared, _ = api_key_factory(tenant=tenant)
    used = datetime(2026, 3, 4, 5, 6, tzinfo=UTC)
    ApiKey.objects.filter(pk=own.pk).update(last_used_at=used)
    client.force_login(team["alice"])
    page = client.get("/api-keys/")
    html = page.content.decode()
    assert '<td data-testid="last-used">2026-03-04 05:06</td>' in html
    assert own.prefix in html and bobs.prefix not in html and shared.prefix not in html
    assert 'id="create-key"' not in html and "Revoke" not in html
    assert list(page.context["keys"]) == [own]


def test_an_admin_creates_a_members_key_with_expiry_and_models(
    client, team, api_key_factory, demo_model
):
    client.force_login(team["admin"])
    response = client.post(
        "/api-keys/",
        {
            "name": "alice-ci",
            "owner": team["alice"].pk,
            "expires_in_days": "30",
            "allowed_models": [demo_model.name],
        },
    )
    assert response.status_code == 200 and response.context["created"]
    key = ApiKey.objects.get(name="alice-ci")
    assert key.owner == team["alice"] and key.created_by == team["admin"]
    assert key.allowed_models == [demo_model.name]
    assert 29 <= (key.expires_at - key.created_at).days <= 30
    client.force_login(team["alice"])
    assert key.prefix in client.get("/api-keys/").content.decode()


def test_an_admin_cannot_give_a_key_to_another_tenants_user(client, team, user_factory):
    outsider = user_factory()
    client.force_login(team["admin"])
    response = client.post("/api-keys/", {"name": "x", "owner": outsider.pk})
    assert response.status_code == 200 and "owner" in response.context["form"].errors
    assert not ApiKey.objects.filter(name="x").exists()
