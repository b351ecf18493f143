"""A rollout step task delivered twice (Celery's acks_late redelivery, a
duplicate message) judges its step once: the second delivery carries the
judgement count it was scheduled with, finds the rollout moved on, and
neither advances a step early nor schedules another."""

from __future__ import annotations

import pytest

from fleet import services
from fleet.models import Deployment, Rollout

pytestmark = pytest.mark.django_db

MODEL = "redelivery-model"


def _rollout(**guardrails) -> Rollout:
    services.deployment_register(model_name=MODEL, version="v1")
    services.deployment_register(model_name=MODEL, version="v2")
    return services.rollout_start(
        model_name=MODEL,
        canary_version="v2",
        steps=[10, 50, 100],
        dwell_seconds=60,
        guardrails=guardrails,
    )


def test_a_redelivered_step_does_not_advance_the_rollout_again():
    rollout = _rollout(min_requests=0)
    first = services.rollout_advance(rollout_id=rollout.pk, judged=0)
    assert (first.step_index, len(first.results)) == (1, 1)
    again = services.rollout_advance(rollout_id=rollout.pk, judged=0)
    assert (again.step_index, len(again.results)) == (1, 1)
    weights = dict(Deployment.objects.values_list("version", "traffic_weight"))
    assert weights == {"v1": 50, "v2": 50}
    # The next scheduled step (judged=1) does advance.
    assert services.rollout_advance(rollout_id=rollout.pk, judged=1).step_index == 2


def test_a_redelivered_extension_is_not_judged_twice():
    """A step short of evidence is extended (one more result, same step); the
    duplicate of that judgement adds nothing."""
    rollout = _rollout(min_requests=1000)
    services.rollout_advance(rollout_id=rollout.pk, judged=0)
    again = services.rollout_advance(rollout_id=rollout.pk, judged=0)
    assert (again.step_index, len(again.results), again.state) == (0, 1, Rollout.State.RAMPING)
