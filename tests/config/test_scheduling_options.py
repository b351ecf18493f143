"""The embedded engine's scheduling options come from settings and the tiers:
the control snapshot's weights when one is published, else the Tier rows."""

from __future__ import annotations

import uuid

import pytest

from config.embedded import scheduling_options
from fleet.services import snapshot_publish
from fleet.snapshot import snapshot_reset


@pytest.fixture(autouse=True)
def private_snapshot(settings):
    """No snapshot until a test publishes one, on a key of its own."""
    settings.FLEET_SNAPSHOT_KEY = f"test-sched-{uuid.uuid4().hex[:10]}:snapshot"
    settings.FLEET_SNAPSHOT_REFRESH = 0.0
    snapshot_reset()
    yield
    snapshot_reset()


def test_the_published_snapshot_wins_over_the_rows(tiers, settings):
    settings.ENGINE_SCHEDULING_POLICY = "fair"
    tiers["pro"].scheduling_weight = "0.40"
    tiers["pro"].save()
    snapshot_publish()
    # Rows changed after the publish stay invisible until the next one.
    tiers["pro"].scheduling_weight = "0.20"
    tiers["pro"].save()
    assert scheduling_options()["tier_weights"]["pro"] == 0.4


def test_fair_share_by_default_with_the_tier_rows_weights(tiers, settings):
    settings.ENGINE_SCHEDULING_POLICY = "fair"
    tiers["pro"].scheduling_weight = "0.40"
    tiers["pro"].save()
    options = scheduling_options()
    assert options["scheduling_policy"] == "fair"
    assert options["tier_weights"] == {"enterprise": 0.5, "pro": 0.4, "free": 0.15}


def test_fcfs_needs_no_weights(tiers, settings):
    settings.ENGINE_SCHEDULING_POLICY = "fcfs"
    assert scheduling_options() == {"scheduling_policy": "fcfs"}


def test_no_tier_rows_leaves_the_engine_defaults(db, settings):
    """Without rows the engine keeps its built-in weights (no tier_weights)."""
    from tenants.models import Tier

    Tier.objects.all().delete()
    settings.ENGINE_SCHEDULING_POLICY = "fair"
    assert scheduling_options() == {"scheduling_policy": "fair"}
