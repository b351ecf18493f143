"""API key authentication and tenant reads."""

import pytest
from django.contrib.auth.models import AnonymousUser

from tenants.selectors import api_key_authenticate, api_key_list, tenant_for_user, tier_get
from tenants.services import api_key_create, api_key_revoke

pytestmark = pytest.mark.django_db


def test_a_fresh_key_authenticates_with_tenant_and_tier_loaded(
    api_key_factory, django_assert_num_queries
):
    """The raw key finds its ApiKey in one query, tenant and tier included."""
    key, raw = api_key_factory(tier="enterprise")
    with django_assert_num_queries(1):
        found = api_key_authenticate(raw_key=raw)
        assert found.tenant.tier.name == "enterprise"
    assert found.pk == key.pk


def test_surrounding_whitespace_is_ignored(api_key_factory):
    """A key pasted with a trailing newline still works."""
    key, raw = api_key_factory()
    assert api_key_authenticate(raw_key=f" {raw}\n").pk == key.pk


def test_a_revoked_key_fails(api_key_factory):
    """Revocation takes effect on the next request."""
    key, raw = api_key_factory()
    api_key_revoke(api_key=key)
    assert api_key_authenticate(raw_key=raw) is None


def test_the_right_prefix_with_a_wrong_secret_fails(api_key_factory):
    """Knowing the visible prefix is not enough."""
    key, raw = api_key_factory()
    prefix, _, secret = raw.partition(".")
    tampered = secret[:-1] + ("A" if secret[-1] != "A" else "B")
    assert api_key_authenticate(raw_key=f"{prefix}.{tampered}") is None
    assert api_key_authenticate(raw_key=prefix) is None
    assert api_key_authenticate(raw_key=f"{prefix}.") is None


def test_a_secret_under_another_keys_prefix_fails(api_key_factory):
    """Prefix and secret must come from the same key."""
    key_a, raw_a = api_key_factory()
    key_b, raw_b = api_key_factory(tenant=key_a.tenant)
    assert api_key_authenticate(raw_key=f"{key_a.prefix}.{raw_b.partition('.')[2]}") is None


@pytest.mark.parametrize("raw", ["", "garbage", "Bearer x", "sk-lp-zzzzzzzz.nosuchkey", "."])
def test_malformed_or_unknown_keys_fail(raw, tiers):
    """Anything that is not a live key yields None, never an exception."""
    assert api_key_authenticate(raw_key=raw) is None


def test_a_key_of_an_inactive_tenant_fails(api_key_factory):
    """Deactivating a tenant disables all its keys at once."""
    key, raw = api_key_factory()
    key.tenant.is_active = False
    key.tenant.save(update_fields=["is_active"])
    assert api_key_authenticate(raw_key=raw) is None


def test_api_key_list_is_scoped_to_the_tenant(tenant_factory):
    """A tenant sees its own keys, newest first, optionally without revoked ones."""
    a, b = tenant_factory(), tenant_factory()
    old, _ = api_key_create(tenant=a, name="old")
    new, _ = api_key_create(tenant=a, name="new")
    api_key_create(tenant=b, name="other")
    api_key_revoke(api_key=old)
    assert [k.name for k in api_key_list(tenant=a)] == ["new", "old"]
    assert [k.pk for k in api_key_list(tenant=a, include_revoked=False)] == [new.pk]


def test_tenant_for_user(user_factory, tenant_factory, django_user_model):
    """Members map to their tenant; strangers and anonymous users to None."""
    tenant = tenant_factory()
    member = user_factory(tenant=tenant, role="admin")
    loner = django_user_model.objects.create_user(username="loner", password="pw")
    assert tenant_for_user(user=member) == tenant
    assert tenant_for_user(user=loner) is None
    assert tenant_for_user(user=AnonymousUser()) is None


def test_tier_get(tiers):
    """Tiers are looked up by name."""
    assert tier_get(name="free") == tiers["free"]
