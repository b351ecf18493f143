"""Key rules: owners are members, expiries lie ahead, allow-lists are names."""

from datetime import timedelta

import pytest
from django.core.exceptions import ValidationError
from django.utils import timezone

from tenants.selectors import api_key_authenticate, api_key_list
from tenants.services import api_key_create

pytestmark = pytest.mark.django_db


def test_a_keys_owner_must_belong_to_its_tenant(tenant_factory, user_factory):
    outsider = user_factory()
    with pytest.raises(ValidationError) as refused:
        api_key_create(tenant=tenant_factory(), name="k", owner=outsider)
    assert "owner" in refused.value.message_dict


def test_expiry_must_lie_ahead_and_ends_authentication(api_key_factory):
    with pytest.raises(ValidationError):
        api_key_factory(expires_at=timezone.now() - timedelta(minutes=1))
    api_key, raw = api_key_factory(expires_at=timezone.now() + timedelta(minutes=1))
    assert api_key_authenticate(raw_key=raw) == api_key
    type(api_key).objects.filter(pk=api_key.pk).update(expires_at=timezone.now())
    assert api_key_authenticate(raw_key=raw) is None


def test_allow_list_is_stored_sorted_and_checked(api_key_factory):
    api_key, _ = api_key_factory(allowed_models=["b", "a", "b"])
    assert api_key.allowed_models == ["a", "b"]
    assert api_key.allows_model("a") and not api_key.allows_model("c")
    with pytest.raises(ValidationError):
        api_key_factory(allowed_models=[""])


def test_a_member_lists_only_their_own_keys(tenant_factory, user_factory):
    tenant = tenant_factory()
    alice, bob = user_factory(tenant=tenant), user_factory(tenant=tenant)
    mine, _ = api_key_create(tenant=tenant, name="mine", owner=alice)
    api_key_create(tenant=tenant, name="bobs", owner=bob)
    api_key_create(tenant=tenant, name="shared")
    assert list(api_key_list(tenant=tenant, owner=alice)) == [mine]
    assert api_key_list(tenant=tenant).count() == 3
