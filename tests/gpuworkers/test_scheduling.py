"""The engine's scheduling options come from settings and the Tier rows."""

from __future__ import annotations

from gpuworkers.scheduling import engine_scheduling_options


def test_fair_share_by_default_with_the_tier_rows_weights(tiers, settings):
    settings.ENGINE_SCHEDULING_POLICY = "fair"
    tiers["pro"].scheduling_weight = "0.40"
    tiers["pro"].save()
    options = engine_scheduling_options()
    assert options["scheduling_policy"] == "fair"
    assert options["tier_weights"] == {"enterprise": 0.5, "pro": 0.4, "free": 0.15}


def test_an_explicit_policy_wins_and_fcfs_needs_no_weights(tiers, settings):
    settings.ENGINE_SCHEDULING_POLICY = "fair"
    assert engine_scheduling_options("fcfs") == {"scheduling_policy": "fcfs"}


def test_no_tier_rows_leaves_the_engine_defaults(db, settings):
    """Without rows the engine keeps its built-in weights (no tier_weights)."""
    from tenants.models import Tier

    Tier.objects.all().delete()
    settings.ENGINE_SCHEDULING_POLICY = "fair"
    assert engine_scheduling_options() == {"scheduling_policy": "fair"}
