"""Reads for the fleet: the served-model catalog, version metrics for guardrails,
the fleet view."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from django.db import DataError
from django.db.models import QuerySet

from billing.models import UsageRecord
from fleet.fallback import DB_UNREACHABLE, db_mark_down, db_marked_down
from fleet.models import Deployment, Rollout, RoutingSettings, ServedModel
from fleet.snapshot import snapshot_current
from tenants.models import Tier
from tokenization.files import converted_demo_dir
from wire.snapshot import Snapshot
from wire.workers import WorkerInfo


def served_model_list(*, tier: Tier) -> QuerySet[ServedModel]:
    """Active models that keys on ``tier`` may call, by name."""
    return ServedModel.objects.filter(is_active=True, tiers=tier).order_by("name")


def served_model_list_active() -> QuerySet[ServedModel]:
    """Every active model with its tiers (the landing page, the snapshot)."""
    return ServedModel.objects.filter(is_active=True).prefetch_related("tiers").order_by("name")


def served_model_get(*, name: str, tier: Tier) -> ServedModel | None:
    """The active model called ``name`` if ``tier`` may use it, else None.

    Unknown, inactive and tier-restricted models are all None: callers
    answer the same 404 so a key cannot probe other tiers' catalogs.
    """
    return served_model_list(tier=tier).filter(name=name).first()


def served_model_dir(*, model: ServedModel) -> Path:
    """The model's Hugging Face directory (the web tier reads its tokenizer).

    A blank path is the demo model, once set-up or its worker converted it
    from its GGUF file; raises ``tokenization.ModelFilesMissing`` before
    then. The web tier never converts (or loads) weights itself.
    """
    if model.path:
        return Path(model.path)
    return converted_demo_dir()


@dataclass(slots=True, frozen=True)
class VersionMetrics:
    """What users of one model version saw during a window."""

    requests: int
    error_rate: float
    ttft_p95_ms: float | None
    content_filter_rate: float
    regenerate_rate: float

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def version_metrics(*, model: str, version: str, since: datetime) -> VersionMetrics:
    """Guardrail metrics from the usage records of ``model@version`` since ``since``.

    Cancelled responses (the client left) count as neither success nor error.
    """
    rows = list(
        UsageRecord.objects.filter(model=model, model_version=version, created_at__gte=since)
        .exclude(status=UsageRecord.Status.CANCELLED)
        .values_list("status", "finish_reason", "ttft_ms", "regenerated")
    )
    total = len(rows)
    if not total:
        return VersionMetrics(0, 0.0, None, 0.0, 0.0)
    ttfts = sorted(t for _, _, t, _ in rows if t is not None)
    p95 = float(ttfts[max(math.ceil(0.95 * len(ttfts)) - 1, 0)]) if ttfts else None
    return VersionMetrics(
        requests=total,
        error_rate=sum(s == UsageRecord.Status.FAILED for s, _, _, _ in rows) / total,
        ttft_p95_ms=p95,
        content_filter_rate=sum(f == "content_filter" for _, f, _, _ in rows) / total,
        regenerate_rate=sum(bool(r) for _, _, _, r in rows) / total,
    )


def routing_settings_get() -> RoutingSettings:
    return RoutingSettings.objects.get_or_create(pk=1)[0]


def deployment_list(*, model: str | None = None):
    deployments = Deployment.objects.all()
    return deployments.filter(model_name=model) if model else deployments


def rollout_active(*, model: str) -> Rollout | None:
    return Rollout.objects.filter(model_name=model, state=Rollout.State.RAMPING).first()


def catalog_model_listed(snapshot: Snapshot | None, *, name: str, tier: Tier) -> ServedModel | None:
    """The model ``name`` if ``snapshot`` lists it for ``tier``; None says
    nothing (``catalog_model_get`` then asks the database). No I/O: an
    async caller needs no thread for the common case."""
    entry = snapshot.models.get(name) if snapshot else None
    if entry is not None and tier.name in entry.tiers:
        return ServedModel(name=entry.name, path=entry.path, context_length=entry.context_length)
    return None


def catalog_model_get(*, name: str, tier: Tier) -> ServedModel | None:
    """The model ``name`` if ``tier`` may call it: from the snapshot, else the database.

    The snapshot answers every request for a model it lists for the tier,
    without a query. A name it does not list (a model registered since the
    last publication) is looked up in the database; with the database down
    that is a 404, like an unknown model.
    """
    listed = catalog_model_listed(snapshot_current(), name=name, tier=tier)
    if listed is not None:
        return listed
    if db_marked_down():
        return None
    try:
        return served_model_get(name=name, tier=tier)
    except DataError:
        # A name no row could hold (the API refuses NUL before this): unknown.
        return None
    except DB_UNREACHABLE:
        db_mark_down()
        return None


def fleet_view(*, workers: list[WorkerInfo]) -> dict[str, Any]:
    """Replicas by model and version with their state and load, plus the snapshot."""
    snapshot = snapshot_current()
    replicas = [
        {
            "worker_id": w.worker_id,
            "model": w.model,
            "version": w.version,
            "state": str(w.state),
            "running": w.running,
            "waiting": w.waiting,
            "kv_usage": round(w.kv_usage, 3),
            "queued_tokens": w.queued_tokens,
            "tokens_per_second": w.tokens_per_second,
            "prefix_cache_hit_tokens": (w.extra or {}).get("prefix_cache_hit_tokens", 0),
            "heartbeat_at": w.heartbeat_at,
        }
        for w in sorted(workers, key=lambda w: (w.model, w.version, w.worker_id))
    ]
    counts: dict[str, int] = {}
    for w in workers:
        counts[str(w.state)] = counts.get(str(w.state), 0) + 1
    return {
        "snapshot_version": snapshot.version if snapshot else None,
        "states": counts,
        "replicas": replicas,
        "deployments": [asdict(d) for d in snapshot.deployments] if snapshot else [],
        "rollouts": [asdict(r) for r in snapshot.rollouts] if snapshot else [],
    }
