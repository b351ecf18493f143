"""Tier seed data and ApiKey/Tenant model rules."""

from decimal import Decimal
from importlib import import_module

import pytest
from django.core.exceptions import ValidationError

from tenants.models import ApiKey, Tier
from tenants.services import DEFAULT_TIERS

pytestmark = pytest.mark.django_db

seed_migration = import_module("tenants.migrations.0002_seed_tiers")


def test_seeded_tiers_have_the_documented_values(tiers):
    """free/pro/enterprise exist with their limits, weights and API access."""
    assert set(tiers) == {"free", "pro", "enterprise"}
    free, pro, ent = tiers["free"], tiers["pro"], tiers["enterprise"]
    assert (free.rpm, free.tpm, free.monthly_token_quota) == (20, 20_000, 1_000_000)
    assert (free.max_context_tokens, free.max_output_tokens) == (2048, 512)
    assert (free.max_concurrent_requests, free.queue_sla_seconds) == (2, 30)
    assert free.api_access is False
    assert (pro.rpm, pro.tpm, pro.monthly_token_quota) == (600, 200_000, 50_000_000)
    assert (pro.max_concurrent_requests, pro.queue_sla_seconds, pro.api_access) == (16, 10, True)
    assert (ent.rpm, ent.tpm, ent.monthly_token_quota) == (3000, 1_000_000, 1_000_000_000)
    assert (ent.max_output_tokens, ent.max_concurrent_requests) == (4096, 64)
    weights = [tiers[n].scheduling_weight for n in ("free", "pro", "enterprise")]
    assert weights == [Decimal("0.15"), Decimal("0.35"), Decimal("0.50")]
    assert sum(weights) == Decimal("1.00")
    assert [tiers[n].priority for n in ("free", "pro", "enterprise")] == [0, 1, 2]


def test_data_migration_seeds_the_default_tiers(tiers):
    """The migration's frozen copy equals DEFAULT_TIERS, and applying it
    writes those values back over edited rows."""
    from django.apps import apps

    # Fields added after 0002 are seeded by their own migrations (0005).
    later = {"priority_service_tier", "auto_service_tier"}
    frozen = [{k: v for k, v in spec.items() if k not in later} for spec in DEFAULT_TIERS]
    assert frozen == seed_migration.TIERS
    Tier.objects.update(rpm=1, api_access=True, scheduling_weight=Decimal("0.01"))
    seed_migration.seed_tiers(apps, None)
    rows = {t.name: t for t in Tier.objects.all()}
    for spec in DEFAULT_TIERS:
        for field, value in spec.items():
            assert getattr(rows[spec["name"]], field) == value, (spec["name"], field)


def test_only_enterprise_may_use_the_priority_service_tier_by_default(tiers):
    """Migration 0005 (and DEFAULT_TIERS): priority is an enterprise setting,
    and every tier's "auto" is "default"."""
    assert {n: t.priority_service_tier for n, t in tiers.items()} == {
        "free": False,
        "pro": False,
        "enterprise": True,
    }
    assert {t.auto_service_tier for t in tiers.values()} == {"default"}


def test_per_key_limits_above_the_tier_are_rejected(tenant_factory):
    """clean() refuses rpm/tpm overrides above the tenant's tier."""
    tenant = tenant_factory(tier="free")
    key = ApiKey(tenant=tenant, name="k", prefix="sk-lp-x", secret_hash="0" * 64)
    key.rpm_limit = 21
    key.tpm_limit = 20_001
    with pytest.raises(ValidationError) as excinfo:
        key.clean()
    assert set(excinfo.value.message_dict) == {"rpm_limit", "tpm_limit"}
    key.rpm_limit, key.tpm_limit = 20, 1000
    key.clean()


def test_effective_limits_use_the_override_but_never_exceed_the_tier(tenant_factory):
    """An override lowers a key's limit; the tier caps it after a downgrade."""
    tenant = tenant_factory(tier="pro")
    key = ApiKey(tenant=tenant, name="k", prefix="sk-lp-y", secret_hash="0" * 64)
    assert (key.effective_rpm, key.effective_tpm) == (600, 200_000)
    key.rpm_limit, key.tpm_limit = 100, 5000
    assert (key.effective_rpm, key.effective_tpm) == (100, 5000)
    key.rpm_limit = 10_000
    assert key.effective_rpm == 600


def test_each_tenant_gets_its_own_cache_salt(tenant_factory):
    """Prefix-cache isolation needs a distinct, non-empty salt per tenant."""
    a, b = tenant_factory(), tenant_factory()
    assert len(a.cache_salt) == 32
    assert a.cache_salt != b.cache_salt
