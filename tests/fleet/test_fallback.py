"""The database-down fallbacks: the authentication cache (usage then goes to the
usage stream: tests/inference/test_usage_fallback.py)."""

from __future__ import annotations

import pytest

from fleet import services
from fleet.fallback import (
    KeyUnverifiable,
    auth_cache_authenticate,
    auth_cache_forget,
    auth_cache_remember,
)
from fleet.snapshot import snapshot_current
from tenants.selectors import api_key_authenticate

pytestmark = pytest.mark.django_db


def test_a_recently_authenticated_key_is_accepted_from_the_cache(api_key_factory):
    services.snapshot_publish()
    snapshot_current()
    api_key, raw = api_key_factory(tier="pro", rpm_limit=7)
    auth_cache_remember(api_key=api_key_authenticate(raw_key=raw))

    cached = auth_cache_authenticate(raw_key=raw)
    assert (cached.pk, cached.tenant.pk, cached.prefix) == (
        api_key.pk,
        api_key.tenant_id,
        api_key.prefix,
    )
    assert cached.tenant.cache_salt == api_key.tenant.cache_salt
    # Limits: the key's own override, the tier's numbers from the snapshot.
    assert cached.effective_rpm == 7
    assert cached.tenant.tier.tpm == api_key.tenant.tier.tpm
    assert auth_cache_authenticate(raw_key=raw[:-3] + "xyz") is None

    auth_cache_forget(raw_key=raw)
    assert auth_cache_authenticate(raw_key=raw) is None


def test_a_key_never_seen_is_unverifiable_not_invalid(api_key_factory):
    services.snapshot_publish()
    _, raw = api_key_factory()
    # A valid key the cache has not seen: the API answers a retryable 503.
    with pytest.raises(KeyUnverifiable):
        auth_cache_authenticate(raw_key=raw)
    assert auth_cache_authenticate(raw_key="no-dot-in-this-key") is None


def test_a_wrong_secret_never_tombstones_the_real_key(api_key_factory):
    """Auth-cache poisoning: anyone can read a prefix in a screenshot and send
    it with a made-up secret. The database refuses that key, but the real
    key's cached entry must survive it, so the real key still works when
    PostgreSQL goes down; the refused key itself stays refused."""
    services.snapshot_publish()
    api_key, raw = api_key_factory(tier="pro")
    auth_cache_remember(api_key=api_key_authenticate(raw_key=raw))
    forged = f"{api_key.prefix}.{'A' * 43}"
    assert api_key_authenticate(raw_key=forged) is None
    auth_cache_forget(raw_key=forged)  # what the API does after the refusal

    assert auth_cache_authenticate(raw_key=raw).pk == api_key.pk
    assert auth_cache_authenticate(raw_key=forged) is None


def test_a_revoked_key_is_tombstoned_and_an_expired_one_refused(api_key_factory):
    from datetime import timedelta

    from django.utils import timezone

    from tenants.services import api_key_revoke

    services.snapshot_publish()
    revoked, raw_revoked = api_key_factory(tier="pro")
    auth_cache_remember(api_key=api_key_authenticate(raw_key=raw_revoked))
    api_key_revoke(api_key=revoked)
    assert api_key_authenticate(raw_key=raw_revoked) is None
    auth_cache_forget(raw_key=raw_revoked)
    assert auth_cache_authenticate(raw_key=raw_revoked) is None

    expiring, raw_expiring = api_key_factory(
        tier="pro", expires_at=timezone.now() + timedelta(seconds=60)
    )
    auth_cache_remember(api_key=api_key_authenticate(raw_key=raw_expiring))
    assert auth_cache_authenticate(raw_key=raw_expiring).pk == expiring.pk
    expiring.expires_at = timezone.now() - timedelta(seconds=1)
    auth_cache_remember(api_key=expiring)
    assert auth_cache_authenticate(raw_key=raw_expiring) is None


def test_revoking_a_key_purges_its_cached_authentication_at_once(
    api_key_factory, django_capture_on_commit_callbacks
):
    """The revocation itself tombstones the shared cache entry: the key is
    refused from the cache during a later outage although no request with it
    reached the database since (it used to work again until the entry's TTL)."""
    from tenants.services import api_key_revoke

    services.snapshot_publish()
    api_key, raw = api_key_factory(tier="pro")
    other, other_raw = api_key_factory(tier="pro", tenant=api_key.tenant)
    for key in (raw, other_raw):
        auth_cache_remember(api_key=api_key_authenticate(raw_key=key))
    with django_capture_on_commit_callbacks(execute=True) as callbacks:
        api_key_revoke(api_key=api_key)
    assert len(callbacks) == 1

    assert auth_cache_authenticate(raw_key=raw) is None
    assert auth_cache_authenticate(raw_key=other_raw).pk == other.pk
    # A request that read the key as valid just before the revocation
    # committed, remembering it afterwards, does not bring it back.
    auth_cache_remember(api_key=api_key)
    assert auth_cache_authenticate(raw_key=raw) is None
