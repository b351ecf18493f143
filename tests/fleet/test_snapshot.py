"""The control snapshot: validated publication, last-valid reading, DB-free catalog."""

from __future__ import annotations

import json

import pytest
import redis

from fleet import services
from fleet.models import Deployment
from fleet.selectors import catalog_model_get, catalog_model_listed
from fleet.services import served_model_register
from fleet.snapshot import snapshot_current, snapshot_reader_status, snapshot_store_raw
from wire.snapshot import SnapshotInvalid, snapshot_parse

pytestmark = pytest.mark.django_db


def test_published_snapshot_carries_deployments_tiers_catalog_and_rising_versions(tiers):
    served_model_register(name="snap-model", context_length=4096, tiers=[tiers["pro"]])
    services.deployment_register(model_name="snap-model", version="v1", hourly_price=2.5)
    first = services.snapshot_publish()
    snap = snapshot_current()
    assert snap.version == first
    assert snap.deployments_of("snap-model")[0].traffic_weight == 100
    assert snap.deployments_of("snap-model")[0].hourly_price == 2.5
    assert snap.models["snap-model"].tiers == ("pro",)
    assert snap.tiers["pro"].queue_sla_seconds == tiers["pro"].queue_sla_seconds
    assert services.snapshot_publish() > first


def test_a_malformed_snapshot_is_refused_and_the_last_valid_one_kept(tiers):
    services.deployment_register(model_name="snap-model", version="v1")
    good = services.snapshot_publish()
    assert snapshot_current().version == good
    broken = services.snapshot_build(version=good + 1)
    broken["deployments"][0]["traffic_weight"] = "lots"
    snapshot_store_raw(json.dumps(broken), good + 1)
    assert snapshot_current().version == good
    snapshot_store_raw("{not json", good + 2)
    assert snapshot_current().version == good
    status = snapshot_reader_status()
    assert status["rejected"] == 2 and status["version"] == good


@pytest.mark.parametrize(
    "breakage",
    [
        lambda d: d.pop("routing"),
        lambda d: d.update(version=0),
        lambda d: d["tiers"]["pro"].update(rpm=True),
        lambda d: d["deployments"].append({**d["deployments"][0], "version": "v2"}),
        lambda d: d["deployments"][0].update(traffic_weight=60),
        lambda d: d["models"]["snap-model"].update(tiers="pro"),
    ],
    ids=["no-routing", "version-0", "bool-as-int", "weights-200", "weights-60", "tiers-str"],
)
def test_schema_violations_are_named(tiers, breakage):
    served_model_register(name="snap-model", context_length=4096)
    services.deployment_register(model_name="snap-model", version="v1")
    document = services.snapshot_build(version=5)
    snapshot_parse(document)
    breakage(document)
    with pytest.raises(SnapshotInvalid):
        snapshot_parse(document)


def test_publishing_refuses_rows_that_break_an_invariant(tiers):
    services.deployment_register(model_name="snap-model", version="v1")
    good = services.snapshot_publish()
    Deployment.objects.filter(version="v1").update(traffic_weight=40)
    with pytest.raises(SnapshotInvalid, match="add up to 40"):
        services.snapshot_publish()
    assert snapshot_current().version == good


def test_an_unreachable_store_keeps_the_last_snapshot(tiers, settings):
    services.deployment_register(model_name="snap-model", version="v1")
    good = services.snapshot_publish()
    assert snapshot_current().version == good
    settings.REDIS_URL = "redis://127.0.0.1:6390/0"  # nothing listens there
    assert snapshot_current().version == good
    assert "unreachable" in snapshot_reader_status()["last_error"]


def test_the_catalog_answers_from_the_snapshot_without_a_query(tiers, django_assert_num_queries):
    served_model_register(name="snap-model", context_length=4096, tiers=[tiers["pro"]])
    services.snapshot_publish()
    snapshot_current()
    with django_assert_num_queries(0):
        model = catalog_model_get(name="snap-model", tier=tiers["pro"])
    assert model.context_length == 4096
    # Not listed for the tier: the database decides (and says no).
    assert catalog_model_get(name="snap-model", tier=tiers["free"]) is None


def test_the_listed_catalog_answers_from_the_snapshot_alone(tiers, django_assert_num_queries):
    """What the request path calls on the event loop: no query, no store
    read; None for what the snapshot does not list for the tier."""
    served_model_register(name="snap-model", context_length=4096, tiers=[tiers["pro"]])
    services.snapshot_publish()
    snap = snapshot_current()
    with django_assert_num_queries(0):
        model = catalog_model_listed(snap, name="snap-model", tier=tiers["pro"])
        assert catalog_model_listed(snap, name="snap-model", tier=tiers["free"]) is None
        assert catalog_model_listed(snap, name="unknown", tier=tiers["pro"]) is None
        assert catalog_model_listed(None, name="snap-model", tier=tiers["pro"]) is None
    assert (model.name, model.context_length) == ("snap-model", 4096)


def test_redis_holds_one_document_per_key(fleet_snapshot_key, settings, tiers):
    services.snapshot_publish()
    client = redis.Redis.from_url(settings.REDIS_URL)
    assert json.loads(client.hget(fleet_snapshot_key, "document"))["version"] >= 1


def test_tiers_carry_their_service_tier_settings_and_older_snapshots_still_parse(tiers):
    """The auth cache's stand-in tier (database down) needs them; a snapshot
    published before them parses with priority off and auto as default."""
    services.snapshot_publish()
    snap = snapshot_current()
    assert snap.tiers["enterprise"].priority_service_tier is True
    assert snap.tiers["pro"].priority_service_tier is False
    assert snap.tiers["pro"].auto_service_tier == "default"
    document = services.snapshot_build(version=1)
    for tier in document["tiers"].values():
        del tier["priority_service_tier"], tier["auto_service_tier"]
    older = snapshot_parse(document)
    assert older.tiers["enterprise"].priority_service_tier is False
    assert older.tiers["enterprise"].auto_service_tier == "default"
    document["tiers"]["pro"]["auto_service_tier"] = 3
    with pytest.raises(SnapshotInvalid, match="auto_service_tier"):
        snapshot_parse(document)
