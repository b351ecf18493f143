"""``manage.py gpuworker`` start-up: deployments and models come from the
control snapshot and the command line, never from the database."""

from __future__ import annotations

import uuid

import pytest
from django.core.management import CommandError, call_command

from fleet import services
from fleet.snapshot import snapshot_reset

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def private_snapshot(settings):
    settings.FLEET_SNAPSHOT_KEY = f"test-gpuworker-{uuid.uuid4().hex[:10]}:snapshot"
    snapshot_reset()
    yield
    snapshot_reset()


def _start(*args: str) -> None:
    call_command("gpuworker", "--model", "start-up-model", *args)


def test_a_deployment_missing_from_the_snapshot_is_refused_without_a_query(
    tiers, django_assert_num_queries
):
    services.deployment_register(model_name="start-up-model", version="v1")
    services.snapshot_publish()
    with django_assert_num_queries(0), pytest.raises(CommandError, match="no deployment"):
        _start("--deployment", "start-up-model@v2")


def test_the_deployment_weights_path_is_read_from_the_snapshot(tiers, tmp_path):
    missing = tmp_path / "not-there"
    services.deployment_register(
        model_name="start-up-model", version="v1", weights_path=str(missing)
    )
    services.snapshot_publish()
    with pytest.raises(CommandError, match=f"{missing} is not a directory"):
        _start("--deployment", "start-up-model@v1")


def test_a_model_outside_the_snapshot_catalog_needs_a_path(tiers):
    with pytest.raises(CommandError, match="not in the control snapshot's catalog"):
        _start()


def test_the_catalog_path_comes_from_the_snapshot(tiers, tmp_path):
    missing = tmp_path / "weights"
    services.served_model_register(name="start-up-model", context_length=4096, path=str(missing))
    services.snapshot_publish()
    with pytest.raises(CommandError, match=f"{missing} is not a directory"):
        _start()


def test_bad_tier_weights_are_refused_before_loading(tiers):
    with pytest.raises(CommandError, match="--tier-weights: weight of 'pro' must be positive"):
        _start("--tier-weights", "pro=0", "--model-path", "/nonexistent")
