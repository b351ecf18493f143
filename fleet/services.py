"""Writes of the control plane: deployments, the snapshot, rollouts, shadow pairs.

Every change that affects routing ends with ``snapshot_publish`` (after
commit), so the data plane sees it within ``FLEET_SNAPSHOT_REFRESH``.
"""

from __future__ import annotations

import logging
import time
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from fleet.guardrails import Verdict, guardrails_check
from fleet.models import Deployment, Rollout, ServedModel, ShadowComparison
from fleet.selectors import routing_settings_get, served_model_list_active, version_metrics
from fleet.snapshot import snapshot_next_version, snapshot_store
from tenants.models import Tier

logger = logging.getLogger(__name__)

DEFAULT_STEPS = [1, 5, 25, 100]


def snapshot_build(*, version: int) -> dict[str, Any]:
    """The control plane's current state as a snapshot document."""
    routing = routing_settings_get()
    tiers = {
        t.name: {
            "name": t.name,
            "display_name": t.display_name,
            "rpm": t.rpm,
            "tpm": t.tpm,
            "monthly_token_quota": t.monthly_token_quota,
            "max_context_tokens": t.max_context_tokens,
            "max_output_tokens": t.max_output_tokens,
            "max_concurrent_requests": t.max_concurrent_requests,
            "scheduling_weight": float(t.scheduling_weight),
            "priority": t.priority,
            "queue_sla_seconds": t.queue_sla_seconds,
            "api_access": t.api_access,
            "priority_service_tier": t.priority_service_tier,
            "auto_service_tier": t.auto_service_tier,
        }
        for t in Tier.objects.all()
    }
    models = {
        m.name: {
            "name": m.name,
            "path": m.path,
            "context_length": m.context_length,
            "tiers": sorted(t.name for t in m.tiers.all()),
        }
        for m in served_model_list_active()
    }
    deployments = [
        {
            "model": d.model_name,
            "version": d.version,
            "weights_path": d.weights_path,
            "replicas": d.replicas,
            "traffic_weight": d.traffic_weight,
            "hourly_price": float(d.hourly_price),
            "warmup_seconds": d.warmup_seconds,
            "state": d.state,
        }
        for d in Deployment.objects.exclude(state=Deployment.State.RETIRED)
    ]
    rollouts = [
        {
            "id": r.pk,
            "model": r.model_name,
            "stable_version": r.stable_version,
            "canary_version": r.canary_version,
            "canary_percent": r.canary_percent,
            "shadow_share": r.shadow_share,
            "state": r.state,
        }
        for r in Rollout.objects.filter(state=Rollout.State.RAMPING)
    ]
    return {
        "version": version,
        "published_at": time.time(),
        "routing": {
            "max_kv_usage": routing.max_kv_usage,
            "max_queue": routing.max_queue,
            "successors": routing.successors,
            "virtual_nodes": routing.virtual_nodes,
            "target_tokens_per_replica": routing.target_tokens_per_replica,
            "max_queue_age_seconds": routing.max_queue_age_seconds,
            "warm_reserve": routing.warm_reserve,
        },
        "tiers": tiers,
        "models": models,
        "deployments": deployments,
        "rollouts": rollouts,
    }


def snapshot_publish() -> int:
    """Build, validate and store a new snapshot; returns its version.

    Raises SnapshotInvalid (nothing is stored) when the rows break an
    invariant, e.g. a model's version weights not adding up to 100.
    """
    version = snapshot_next_version()
    snapshot_store(snapshot_build(version=version))
    return version


def _publish_on_commit() -> None:
    transaction.on_commit(snapshot_publish)


@transaction.atomic
def deployment_register(
    *,
    model_name: str,
    version: str,
    weights_path: str = "",
    replicas: int = 1,
    hourly_price: Decimal | float = 0,
    warmup_seconds: int = 120,
) -> Deployment:
    """Create or update ``model@version``; the model's first version takes all traffic."""
    deployment = Deployment.objects.filter(model_name=model_name, version=version).first()
    if deployment is None:
        first = not Deployment.objects.filter(model_name=model_name).exists()
        deployment = Deployment(
            model_name=model_name, version=version, traffic_weight=100 if first else 0
        )
        if not first:
            deployment.state = Deployment.State.WARM_STANDBY
    deployment.weights_path = weights_path
    deployment.replicas = replicas
    deployment.hourly_price = Decimal(str(hourly_price))
    deployment.warmup_seconds = warmup_seconds
    deployment.full_clean()
    deployment.save()
    _publish_on_commit()
    return deployment


def _set_weights(model_name: str, weights: dict[str, int]) -> None:
    for deployment in Deployment.objects.select_for_update().filter(model_name=model_name):
        weight = weights.get(deployment.version, 0)
        deployment.traffic_weight = weight
        if weight > 0:
            deployment.state = Deployment.State.ACTIVE
        elif deployment.state == Deployment.State.ACTIVE:
            deployment.state = Deployment.State.WARM_STANDBY
        deployment.save(update_fields=["traffic_weight", "state", "updated_at"])


@transaction.atomic
def rollout_start(
    *,
    model_name: str,
    canary_version: str,
    steps: list[int] | None = None,
    dwell_seconds: float = 600.0,
    shadow_share: float = 0.0,
    grace_seconds: float = 3600.0,
    guardrails: dict[str, float] | None = None,
) -> Rollout:
    """Put ``canary_version`` on the first traffic step; the caller schedules the steps.

    The stable version is the one taking all of the model's traffic now.
    Raises ValidationError for a missing canary deployment, bad steps or a
    model already mid-rollout.
    """
    from django.core.exceptions import ValidationError

    stable = (
        Deployment.objects.select_for_update()
        .filter(model_name=model_name, traffic_weight=100)
        .first()
    )
    if stable is None:
        raise ValidationError(f"{model_name} has no version taking all its traffic")
    if not Deployment.objects.filter(model_name=model_name, version=canary_version).exists():
        raise ValidationError(f"register {model_name}@{canary_version} first")
    if Rollout.objects.filter(model_name=model_name, state=Rollout.State.RAMPING).exists():
        raise ValidationError(f"{model_name} is already rolling out")
    rollout = Rollout(
        model_name=model_name,
        stable_version=stable.version,
        canary_version=canary_version,
        steps=list(steps or DEFAULT_STEPS),
        dwell_seconds=dwell_seconds,
        shadow_share=shadow_share,
        grace_seconds=grace_seconds,
        guardrails=guardrails or {},
        step_started_at=timezone.now(),
    )
    rollout.full_clean()
    rollout.save()
    first = rollout.steps[0]
    _set_weights(model_name, {stable.version: 100 - first, canary_version: first})
    _publish_on_commit()
    return rollout


@transaction.atomic
def rollout_advance(*, rollout_id: int, judged: int | None = None) -> Rollout:
    """End the current step: roll back on a breach, else go to the next step.

    A step without enough canary requests is extended (the step's window
    keeps growing) rather than judged on no evidence.

    ``judged`` is how many judgements the rollout had when this one was
    scheduled (each appends one result): compare-and-set, so a redelivered
    or duplicated step task finds it moved on and changes nothing, rather
    than judge a step again before its dwell time (None: no check).
    """
    rollout = Rollout.objects.select_for_update().get(pk=rollout_id)
    if rollout.state != Rollout.State.RAMPING:
        return rollout
    if judged is not None and len(rollout.results) != judged:
        return rollout
    since = rollout.step_started_at
    canary = version_metrics(model=rollout.model_name, version=rollout.canary_version, since=since)
    stable = version_metrics(model=rollout.model_name, version=rollout.stable_version, since=since)
    verdict = guardrails_check(canary=canary, stable=stable, limits=rollout.guardrails)
    rollout.results = [*rollout.results, _result(rollout, canary, stable, verdict)]
    if verdict.breaches:
        return _roll_back(rollout, "guardrail breach: " + "; ".join(verdict.breaches))
    if not verdict.passed:
        rollout.save(update_fields=["results"])
        return rollout
    if rollout.step_index + 1 < len(rollout.steps):
        rollout.step_index += 1
        rollout.step_started_at = timezone.now()
        percent = rollout.steps[rollout.step_index]
        weights = {rollout.stable_version: 100 - percent, rollout.canary_version: percent}
        _set_weights(rollout.model_name, weights)
        rollout.save(update_fields=["results", "step_index", "step_started_at"])
    else:
        rollout.state = Rollout.State.COMPLETED
        rollout.finished_at = timezone.now()
        rollout.grace_until = rollout.finished_at + timedelta(seconds=rollout.grace_seconds)
        rollout.save(update_fields=["results", "state", "finished_at", "grace_until"])
    _publish_on_commit()
    return rollout


def _result(rollout: Rollout, canary, stable, verdict: Verdict) -> dict[str, Any]:
    return {
        "step": rollout.step_index,
        "percent": rollout.steps[rollout.step_index],
        "at": timezone.now().isoformat(),
        "canary": canary.to_dict(),
        "stable": stable.to_dict(),
        "breaches": verdict.breaches,
        "passed": verdict.passed,
    }


def _roll_back(rollout: Rollout, reason: str) -> Rollout:
    _set_weights(rollout.model_name, {rollout.stable_version: 100})
    rollout.state = Rollout.State.ROLLED_BACK
    rollout.reason = reason
    rollout.finished_at = timezone.now()
    rollout.save(update_fields=["results", "state", "reason", "finished_at"])
    logger.warning("rollout %s rolled back: %s", rollout.pk, reason)
    _publish_on_commit()
    return rollout


@transaction.atomic
def rollout_rollback(*, rollout_id: int, reason: str = "rolled back by an operator") -> Rollout:
    """Send all traffic back to the stable version: a routing change only.

    Allowed while ramping, and after completion while the stable version
    is still warm (before ``grace_until``).
    """
    from django.core.exceptions import ValidationError

    rollout = Rollout.objects.select_for_update().get(pk=rollout_id)
    if rollout.state == Rollout.State.ROLLED_BACK:
        return rollout
    if rollout.state == Rollout.State.COMPLETED and (
        rollout.grace_until is None or rollout.grace_until < timezone.now()
    ):
        raise ValidationError("the grace period is over: the previous version is not warm")
    return _roll_back(rollout, reason)


@transaction.atomic
def standby_retire() -> list[str]:
    """Retire previous versions whose rollout's grace period has ended."""
    retired = []
    for rollout in Rollout.objects.filter(
        state=Rollout.State.COMPLETED, grace_until__lt=timezone.now()
    ):
        standby = Deployment.objects.filter(
            model_name=rollout.model_name,
            version=rollout.stable_version,
            state=Deployment.State.WARM_STANDBY,
            traffic_weight=0,
        )
        count = 0
        # One save per row, not a bulk UPDATE: the audit log records saves.
        for deployment in standby:
            deployment.state = Deployment.State.RETIRED
            deployment.save(update_fields=["state", "updated_at"])
            count += 1
        if count:
            retired.append(f"{rollout.model_name}@{rollout.stable_version}")
    if retired:
        _publish_on_commit()
    return retired


def shadow_comparison_record(
    *,
    rollout_id: int,
    tenant_id: int | None = None,
    response_id: str,
    shadow_response_id: str,
    prompt_tokens: int,
    stable_version: str,
    canary_version: str,
    stable: tuple[str, str, int],
    canary: tuple[str, str, int],
) -> ShadowComparison:
    """Store one shadow pair: (terminal type, text, completion tokens) per side."""
    comparison = ShadowComparison(
        rollout_id=rollout_id,
        tenant_id=tenant_id,
        response_id=response_id,
        shadow_response_id=shadow_response_id,
        prompt_tokens=prompt_tokens,
        stable_version=stable_version,
        canary_version=canary_version,
        stable_status=str(stable[0]),
        stable_text=stable[1],
        stable_completion_tokens=stable[2],
        canary_status=str(canary[0]),
        canary_text=canary[1],
        canary_completion_tokens=canary[2],
        identical=stable[1] == canary[1],
    )
    comparison.save()
    return comparison


def shadow_comparison_purge(*, now: datetime | None = None) -> int:
    """Delete comparisons past SHADOW_RETENTION_DAYS, and those of tenants
    that have withdrawn their opt-in; returns how many went."""
    cutoff = (now or timezone.now()) - timedelta(days=settings.SHADOW_RETENTION_DAYS)
    stale = Q(created_at__lt=cutoff) | Q(tenant__shadow_opt_in=False)
    deleted, _ = ShadowComparison.objects.filter(stale).delete()
    return deleted


@transaction.atomic
def served_model_register(
    *,
    name: str,
    context_length: int,
    path: str = "",
    tiers: list[Tier] | None = None,
    description: str = "",
) -> ServedModel:
    """Create or update the catalog row ``name``, open to ``tiers`` (all when None)."""
    model = ServedModel.objects.filter(name=name).first() or ServedModel(name=name)
    model.path = path
    model.context_length = context_length
    model.description = description
    model.is_active = True
    model.full_clean()
    model.save()
    model.tiers.set(Tier.objects.all() if tiers is None else tiers)
    return model
