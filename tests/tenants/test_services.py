"""Tenant, membership and API key services."""

from datetime import timedelta

import pytest
from django.core.exceptions import ValidationError
from django.db import IntegrityError
from django.utils import timezone

from tenants.models import ApiKey, Membership, Tier, hash_api_key
from tenants.services import (
    api_key_create,
    api_key_revoke,
    api_key_touch,
    api_key_touch_due,
    membership_create,
    tenant_create,
    tenant_get_or_create,
    tenant_set_tier,
)

pytestmark = pytest.mark.django_db


def test_tenant_create_slugifies_and_keeps_slugs_unique(tiers):
    """Names that slugify alike still get distinct slugs."""
    a = tenant_create(name="Acme Inc", tier_name="pro")
    b = tenant_create(name="acme inc!", tier_name="free")
    assert a.slug == "acme-inc"
    assert b.slug.startswith("acme-inc-") and b.slug != a.slug
    assert (a.tier, b.tier) == (tiers["pro"], tiers["free"])


def test_tenant_create_rejects_an_unknown_tier(tiers):
    """A typo in the tier name is an error, not a silent default."""
    with pytest.raises(Tier.DoesNotExist):
        tenant_create(name="nope", tier_name="platinum")


def test_tenant_get_or_create_returns_the_existing_tenant_unchanged(tiers):
    """The second call finds the tenant and does not move it to another tier."""
    first, created = tenant_get_or_create(name="Globex", tier_name="pro")
    again, created_again = tenant_get_or_create(name="Globex", tier_name="enterprise")
    assert (created, created_again) == (True, False)
    assert again.pk == first.pk
    assert again.tier.name == "pro"


def test_tenant_set_tier_lowers_key_overrides_above_the_new_tier(tenant_factory):
    """After a downgrade every key's overrides still pass ApiKey.clean()."""
    tenant = tenant_factory(tier="enterprise")
    key, _ = api_key_create(tenant=tenant, name="k", rpm_limit=2000, tpm_limit=10_000)
    tenant_set_tier(tenant=tenant, tier_name="free")
    key.refresh_from_db()
    assert tenant.tier.name == "free"
    assert (key.rpm_limit, key.tpm_limit) == (20, 10_000)
    key.full_clean()


def test_membership_is_one_tenant_per_user(tenant_factory, django_user_model):
    """A user can belong to one tenant only."""
    user = django_user_model.objects.create_user(username="alice", password="pw")
    membership = membership_create(user=user, tenant=tenant_factory(), role="admin")
    assert membership.role == Membership.Role.ADMIN
    with pytest.raises(ValidationError):
        membership_create(user=user, tenant=tenant_factory(), role="member")


def test_membership_rejects_an_unknown_role(tenant_factory, django_user_model):
    """Roles are admin or member."""
    user = django_user_model.objects.create_user(username="bob", password="pw")
    with pytest.raises(ValidationError):
        membership_create(user=user, tenant=tenant_factory(), role="owner")


def test_api_key_is_stored_only_as_a_hash(tenant_factory):
    """The raw key is prefix.secret; only its SHA-256 and the prefix are kept."""
    api_key, raw = api_key_create(tenant=tenant_factory(), name="ci")
    prefix, _, secret = raw.partition(".")
    assert prefix == api_key.prefix
    assert prefix.startswith("sk-lp-") and len(prefix) == len("sk-lp-") + 8
    assert len(secret) >= 43  # 32 random bytes, base64url
    stored = ApiKey.objects.get(pk=api_key.pk)
    assert stored.secret_hash == hash_api_key(raw)
    row_values = [str(v) for v in ApiKey.objects.filter(pk=api_key.pk).values().get().values()]
    assert not any(secret in v for v in row_values)


def test_api_keys_are_unique(tenant_factory):
    """Two keys never share a prefix or a secret."""
    tenant = tenant_factory()
    keys = [api_key_create(tenant=tenant, name=f"k{i}") for i in range(20)]
    assert len({k.prefix for k, _ in keys}) == 20
    assert len({raw for _, raw in keys}) == 20


def test_api_key_create_rejects_limits_above_the_tier(tenant_factory):
    """Per-key overrides must stay within the tenant's tier."""
    tenant = tenant_factory(tier="pro")
    with pytest.raises(ValidationError) as excinfo:
        api_key_create(tenant=tenant, name="greedy", rpm_limit=601)
    assert "rpm_limit" in excinfo.value.message_dict
    with pytest.raises(ValidationError):
        api_key_create(tenant=tenant, name="greedy", tpm_limit=200_001)
    assert not ApiKey.objects.filter(tenant=tenant).exists()
    key, _ = api_key_create(tenant=tenant, name="ok", rpm_limit=600, tpm_limit=1)
    assert (key.rpm_limit, key.tpm_limit) == (600, 1)


def test_prefix_uniqueness_is_enforced_by_the_database(api_key_factory):
    """The prefix is the lookup key, so the database refuses duplicates."""
    key, _ = api_key_factory()
    with pytest.raises(IntegrityError):
        ApiKey.objects.create(tenant=key.tenant, name="dup", prefix=key.prefix, secret_hash="x")


def test_api_key_revoke_is_idempotent(api_key_factory):
    """Revoking twice keeps the first revocation time."""
    key, _ = api_key_factory()
    api_key_revoke(api_key=key)
    first = key.revoked_at
    assert first is not None and key.is_revoked
    api_key_revoke(api_key=key)
    assert ApiKey.objects.get(pk=key.pk).revoked_at == first


def test_api_key_touch_writes_at_most_once_per_interval(api_key_factory):
    """The first use writes last_used_at; uses within 60 s do not."""
    key, _ = api_key_factory()
    assert api_key_touch(api_key=key) is True
    first = ApiKey.objects.get(pk=key.pk).last_used_at
    assert first is not None
    assert api_key_touch(api_key=key) is False
    assert ApiKey.objects.get(pk=key.pk).last_used_at == first
    # Age the stamp past the interval: the next use writes again.
    ApiKey.objects.filter(pk=key.pk).update(last_used_at=timezone.now() - timedelta(seconds=61))
    assert api_key_touch(api_key=key) is True
    assert ApiKey.objects.get(pk=key.pk).last_used_at > first - timedelta(seconds=1)


def test_api_key_touch_is_due_only_once_the_loaded_stamp_is_older_than_the_interval(
    api_key_factory,
):
    """What the request path checks on the key it just loaded before it
    spends a query (and a thread hop) on api_key_touch."""
    key, _ = api_key_factory()
    assert api_key_touch_due(api_key=key) is True  # never used
    api_key_touch(api_key=key)
    loaded = ApiKey.objects.get(pk=key.pk)
    assert api_key_touch_due(api_key=loaded) is False
    ApiKey.objects.filter(pk=key.pk).update(last_used_at=timezone.now() - timedelta(seconds=61))
    loaded = ApiKey.objects.get(pk=key.pk)
    assert api_key_touch_due(api_key=loaded) is True
    assert api_key_touch(api_key=loaded) is True
