"""Staff admin for tenants and API keys."""

import pytest
from django.contrib.messages import get_messages
from django.urls import reverse

from tenants.models import ApiKey
from tenants.selectors import api_key_authenticate

pytestmark = [pytest.mark.django_db, pytest.mark.urls("tests.tenants.admin_urls")]


def test_adding_a_key_shows_the_raw_key_once(admin_client, tenant_factory, admin_user):
    """The add form creates a hashed key and reveals the raw key in a message."""
    tenant = tenant_factory(tier="pro")
    response = admin_client.post(
        reverse("admin:tenants_apikey_add"),
        {"tenant": tenant.pk, "name": "from-admin", "rpm_limit": "100", "tpm_limit": ""},
    )
    assert response.status_code == 302
    api_key = ApiKey.objects.get(name="from-admin")
    shown = [str(m) for m in get_messages(response.wsgi_request) if "shown only" in str(m)]
    assert len(shown) == 1
    raw = shown[0].rsplit(" ", 1)[-1]
    assert api_key_authenticate(raw_key=raw).pk == api_key.pk
    assert (api_key.created_by, api_key.rpm_limit) == (admin_user, 100)

    # The redirect target shows the message once; later pages never show
    # the raw key, and no page ever shows the stored hash.
    change = reverse("admin:tenants_apikey_change", args=[api_key.pk])
    first, second = admin_client.get(change), admin_client.get(change)
    assert raw in first.content.decode()
    for page in (first, second):
        assert page.status_code == 200
        assert api_key.prefix in page.content.decode()
        assert api_key.secret_hash not in page.content.decode()
    assert raw not in second.content.decode()


def test_the_add_form_refuses_limits_above_the_tier(admin_client, tenant_factory):
    """A free-tier key cannot be given pro-sized limits."""
    tenant = tenant_factory(tier="free")
    response = admin_client.post(
        reverse("admin:tenants_apikey_add"),
        {"tenant": tenant.pk, "name": "too-big", "rpm_limit": "500", "tpm_limit": ""},
    )
    assert response.status_code == 200
    assert "rpm_limit" in response.context["adminform"].form.errors
    assert not ApiKey.objects.filter(name="too-big").exists()


def test_revoke_action_disables_the_selected_keys(admin_client, api_key_factory):
    """The bulk action revokes keys, which then fail authentication."""
    (key_a, raw_a), (key_b, raw_b) = api_key_factory(), api_key_factory()
    response = admin_client.post(
        reverse("admin:tenants_apikey_changelist"),
        {"action": "revoke_keys", "_selected_action": [key_a.pk]},
    )
    assert response.status_code == 302
    assert api_key_authenticate(raw_key=raw_a) is None
    assert api_key_authenticate(raw_key=raw_b).pk == key_b.pk


@pytest.mark.parametrize("model", ["tier", "tenant", "membership", "apikey"])
def test_changelists_render(admin_client, user_factory, api_key_factory, model):
    """Every tenants admin page lists its rows."""
    user_factory(role="admin")
    api_key_factory()
    response = admin_client.get(reverse(f"admin:tenants_{model}_changelist"))
    assert response.status_code == 200
    assert response.context["cl"].result_count >= 1


def test_tenant_page_shows_memberships_inline(admin_client, tenant_factory, user_factory):
    """The tenant change page edits its memberships inline."""
    tenant = tenant_factory()
    user = user_factory(tenant=tenant)
    response = admin_client.get(reverse("admin:tenants_tenant_change", args=[tenant.pk]))
    assert response.status_code == 200
    assert response.context["inline_admin_formsets"][0].formset.queryset.get().user == user
