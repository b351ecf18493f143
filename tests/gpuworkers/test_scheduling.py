"""A worker's scheduling options: the snapshot's tier weights win, the
weights it was started with stand in without one, else the engine's."""

from __future__ import annotations

import time

import pytest

from gpuworkers.scheduling import (
    engine_scheduling_options,
    request_scheduling,
    tier_weights_parse,
)
from wire.requests import GenerationRequest, ServiceClass
from wire.sampling import Sampling
from wire.snapshot import RoutingThresholds, Snapshot, TierSettings


def _snapshot(**weights: float) -> Snapshot:
    tiers = {
        name: TierSettings(
            name=name,
            display_name=name,
            rpm=1,
            tpm=1,
            monthly_token_quota=1,
            max_context_tokens=1,
            max_output_tokens=1,
            max_concurrent_requests=1,
            scheduling_weight=weight,
            priority=0,
            queue_sla_seconds=1,
            api_access=True,
        )
        for name, weight in weights.items()
    }
    return Snapshot(version=1, published_at=time.time(), routing=RoutingThresholds(), tiers=tiers)


def test_the_snapshot_wins_over_the_start_up_weights():
    options = engine_scheduling_options(
        "fair", snapshot=_snapshot(pro=0.4, free=0.1), fallback_weights={"pro": 0.9}
    )
    assert options == {"scheduling_policy": "fair", "tier_weights": {"pro": 0.4, "free": 0.1}}


def test_start_up_weights_stand_in_without_a_snapshot():
    options = engine_scheduling_options("fair", snapshot=None, fallback_weights={"pro": 0.9})
    assert options["tier_weights"] == {"pro": 0.9}


def test_a_snapshot_without_positive_weights_falls_back():
    options = engine_scheduling_options(
        "fair", snapshot=_snapshot(pro=0.0), fallback_weights={"pro": 0.9}
    )
    assert options["tier_weights"] == {"pro": 0.9}


def test_neither_leaves_the_engine_defaults_and_fcfs_needs_no_weights():
    assert engine_scheduling_options("fair", snapshot=None) == {"scheduling_policy": "fair"}
    assert engine_scheduling_options("fcfs", snapshot=_snapshot(pro=0.4)) == {
        "scheduling_policy": "fcfs"
    }


def test_tier_weights_parse_reads_the_command_line_form():
    assert tier_weights_parse("enterprise=0.5, pro=0.35,free=0.15") == {
        "enterprise": 0.5,
        "pro": 0.35,
        "free": 0.15,
    }


@pytest.mark.parametrize(
    ("text", "fault"),
    [("pro", "TIER=WEIGHT"), ("pro=x", "not a number"), ("pro=0", "positive"), ("=1", "TIER")],
)
def test_tier_weights_parse_names_the_fault(text, fault):
    with pytest.raises(ValueError, match=fault):
        tier_weights_parse(text)


def test_a_request_reaches_the_engine_with_its_tier_and_tenant():
    """The tenant is the wire request's (a string for the engine's fair
    share); without one the engine's anonymous tenant of the tier."""
    request = GenerationRequest(
        "r1",
        "m",
        [1],
        Sampling(),
        priority=2,
        tier="pro",
        tenant_id=42,
        service_class=ServiceClass.BATCH,
    )
    assert request_scheduling(request) == {
        "priority": 2,
        "tier": "pro",
        "tenant": "42",
        "service_class": "batch",
    }
    shadow = GenerationRequest("r2", "m", [1], Sampling(), tier="free")
    assert request_scheduling(shadow) == {
        "priority": 0,
        "tier": "free",
        "tenant": None,
        "service_class": "default",
    }
