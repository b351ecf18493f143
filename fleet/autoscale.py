"""The autoscaling signal: how many replicas a model should have, and why.

Driven by demand the web tier can see before GPUs saturate, not by GPU
utilisation: the age of the oldest request still waiting for its first
token, and the admitted tokens (KV held by running requests plus prompts
queued). A new replica is useful only ``warmup_seconds`` from now, so the
token load is projected that far ahead from its recent trend, replicas
already warming count as capacity on the way, and a warm reserve is kept
on top. The signal is advice for an operator or an orchestrator; nothing
here starts or stops processes.
"""

from __future__ import annotations

import math
import time
from collections import deque
from dataclasses import asdict, dataclass, field
from typing import Any

from wire.snapshot import RoutingThresholds, Snapshot
from wire.workers import WorkerInfo, WorkerState

# Load samples kept per model for the trend (seconds).
TREND_WINDOW = 300.0
DEFAULT_WARMUP_SECONDS = 120


@dataclass(slots=True)
class ScaleSignal:
    model: str
    ready: int
    warming: int
    draining: int
    admitted_tokens: int
    queue_age_seconds: float
    tokens_per_second: float
    warmup_seconds: int
    forecast_tokens: int
    desired_replicas: int
    # desired minus (ready + warming): positive means start that many.
    delta: int
    action: str
    reasons: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


_history: dict[str, deque[tuple[float, int]]] = {}


def admitted_tokens(worker: WorkerInfo) -> int:
    block_size = int((worker.extra or {}).get("block_size", 16))
    return worker.kv_blocks_used * block_size + worker.queued_tokens


def _forecast(model: str, now: float, tokens: int, horizon: float) -> int:
    samples = _history.setdefault(model, deque())
    samples.append((now, tokens))
    while samples and now - samples[0][0] > TREND_WINDOW:
        samples.popleft()
    then, before = samples[0]
    if now - then < 1.0:
        return tokens
    slope = (tokens - before) / (now - then)
    # Only growth is projected: shedding capacity waits for the load itself.
    return tokens + max(0, round(slope * horizon))


def scale_signal(
    *, model: str, workers: list[WorkerInfo], snapshot: Snapshot | None, now: float | None = None
) -> ScaleSignal:
    now = time.time() if now is None else now
    limits = snapshot.routing if snapshot else RoutingThresholds()
    deployments = snapshot.deployments_of(model) if snapshot else []
    warmup = max((d.warmup_seconds for d in deployments), default=DEFAULT_WARMUP_SECONDS)
    mine = [w for w in workers if w.model == model]
    ready = [w for w in mine if w.state == WorkerState.READY]
    warming = sum(w.state == WorkerState.WARMING for w in mine)
    draining = sum(w.state == WorkerState.DRAINING for w in mine)
    tokens = sum(admitted_tokens(w) for w in ready)
    age = max((float((w.extra or {}).get("queue_age_seconds", 0.0)) for w in ready), default=0.0)
    forecast = _forecast(model, now, tokens, warmup)
    reasons = []
    by_tokens = math.ceil(forecast / max(limits.target_tokens_per_replica, 1))
    if by_tokens > len(ready):
        reasons.append(
            f"{forecast} admitted tokens expected in {warmup}s need {by_tokens} replicas"
            f" at {limits.target_tokens_per_replica} each"
        )
    by_age = len(ready)
    if age > limits.max_queue_age_seconds:
        # Queue age grows with the shortfall: scale in proportion, at most double.
        factor = min(age / limits.max_queue_age_seconds, 2.0)
        by_age = math.ceil(max(len(ready), 1) * factor)
        reasons.append(f"oldest queued request waited {age:.1f}s")
    floor = min(1, len(mine)) if not deployments else max(1, min(d.replicas for d in deployments))
    desired = max(by_tokens, by_age if age > limits.max_queue_age_seconds else 0, floor)
    desired += limits.warm_reserve
    if limits.warm_reserve:
        reasons.append(f"{limits.warm_reserve} warm reserve")
    delta = desired - (len(ready) + warming)
    action = "scale_up" if delta > 0 else "scale_down" if delta < 0 else "hold"
    if warming and delta <= 0 < by_tokens - len(ready):
        reasons.append(f"{warming} replica(s) already warming cover it")
    return ScaleSignal(
        model=model,
        ready=len(ready),
        warming=warming,
        draining=draining,
        admitted_tokens=tokens,
        queue_age_seconds=round(age, 3),
        tokens_per_second=round(sum(w.tokens_per_second for w in ready), 2),
        warmup_seconds=warmup,
        forecast_tokens=forecast,
        desired_replicas=desired,
        delta=delta,
        action=action,
        reasons=reasons,
    )


def fleet_signal(*, workers: list[WorkerInfo], snapshot: Snapshot | None) -> list[ScaleSignal]:
    models = {w.model for w in workers}
    if snapshot:
        models |= {d.model for d in snapshot.deployments}
    return [scale_signal(model=m, workers=workers, snapshot=snapshot) for m in sorted(models)]
