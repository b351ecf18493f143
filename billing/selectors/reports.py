"""The GPU cost report: what a million useful tokens cost, per model and day.

GPU cost is what the workers' time cost, busy or idle: the sum over samples
of (busy + idle) seconds / 3600 x the worker's hourly price. Useful tokens
are the prompt and completion tokens of completed responses; tokens of
failed and cancelled responses are reported as lost (GPU work nobody got).
Responses cut by a content filter (incomplete) are neither.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import date, timedelta
from decimal import Decimal

from django.db.models import Count, Sum

from billing.models import GpuUsageSample, UsageRecord
from billing.selectors.usage import day_bounds

SECONDS_PER_HOUR = Decimal(3600)
MILLION = Decimal(1_000_000)
# Worker counters are reported to the millisecond.
SECOND_PRECISION = Decimal("0.001")


def csv_text(value) -> str:
    """A report value as CSV text: Decimals to at most 10 places, without trailing zeros."""
    if value is None:
        return ""
    if isinstance(value, Decimal):
        return f"{value.quantize(Decimal('1e-10')).normalize():f}"
    return str(value)


def seconds(value: float) -> Decimal:
    return Decimal(repr(value)).quantize(SECOND_PRECISION)


@dataclass(slots=True)
class GpuCostRow:
    day: date
    model: str
    busy_seconds: Decimal = Decimal(0)
    idle_seconds: Decimal = Decimal(0)
    gpu_cost: Decimal = Decimal(0)
    completed_responses: int = 0
    useful_tokens: int = 0
    failed_responses: int = 0
    cancelled_responses: int = 0
    lost_tokens: int = 0

    @property
    def gpu_seconds(self) -> Decimal:
        return self.busy_seconds + self.idle_seconds

    @property
    def gpu_hours(self) -> Decimal:
        return self.gpu_seconds / SECONDS_PER_HOUR

    @property
    def idle_share(self) -> Decimal | None:
        """Idle over busy + idle; None without GPU time."""
        return self.idle_seconds / self.gpu_seconds if self.gpu_seconds else None

    @property
    def cost_per_million_useful(self) -> Decimal | None:
        """GPU cost per 1M useful tokens; None when nothing useful was produced."""
        return self.gpu_cost * MILLION / self.useful_tokens if self.useful_tokens else None

    def as_dict(self) -> dict:
        return {
            "day": self.day,
            "model": self.model,
            "busy_seconds": self.busy_seconds,
            "idle_seconds": self.idle_seconds,
            "idle_share": self.idle_share,
            "gpu_cost": self.gpu_cost,
            "completed_responses": self.completed_responses,
            "useful_tokens": self.useful_tokens,
            "cost_per_million_useful": self.cost_per_million_useful,
            "failed_responses": self.failed_responses,
            "cancelled_responses": self.cancelled_responses,
            "lost_tokens": self.lost_tokens,
        }


CSV_COLUMNS = list(GpuCostRow(day=date.min, model="").as_dict())


def _day_rows(day: date) -> dict[str, GpuCostRow]:
    rows: dict[str, GpuCostRow] = {}
    samples = (
        GpuUsageSample.objects.filter(day=day)
        .values("model", "hourly_price")
        .annotate(busy=Sum("busy_seconds"), idle=Sum("idle_seconds"))
    )
    for s in samples:
        row = rows.setdefault(s["model"], GpuCostRow(day, s["model"]))
        busy, idle = seconds(s["busy"]), seconds(s["idle"])
        row.busy_seconds += busy
        row.idle_seconds += idle
        row.gpu_cost += (busy + idle) / SECONDS_PER_HOUR * s["hourly_price"]
    since, until = day_bounds(day, day)
    usage = (
        UsageRecord.objects.filter(created_at__gte=since, created_at__lt=until)
        .values("model", "status")
        .annotate(n=Count("id"), prompt=Sum("prompt_tokens"), completion=Sum("completion_tokens"))
    )
    for u in usage:
        row = rows.setdefault(u["model"], GpuCostRow(day, u["model"]))
        tokens = int(u["prompt"]) + int(u["completion"])
        if u["status"] == UsageRecord.Status.COMPLETED:
            row.completed_responses += u["n"]
            row.useful_tokens += tokens
        elif u["status"] == UsageRecord.Status.FAILED:
            row.failed_responses += u["n"]
            row.lost_tokens += tokens
        elif u["status"] == UsageRecord.Status.CANCELLED:
            row.cancelled_responses += u["n"]
            row.lost_tokens += tokens
    return rows


def gpu_cost_report(
    *,
    start: date,
    end: date,
    on_progress: Callable[[int, int], None] | None = None,
) -> list[GpuCostRow]:
    """One row per day and model from ``start`` to ``end`` (inclusive), by day then model.

    ``on_progress(done, total)`` is called after each day, for long runs.
    """
    total = (end - start).days + 1
    report: list[GpuCostRow] = []
    for done in range(total):
        rows = _day_rows(start + timedelta(days=done))
        report.extend(rows[model] for model in sorted(rows))
        if on_progress is not None:
            on_progress(done + 1, total)
    return report


def gpu_cost_totals(rows: list[GpuCostRow]) -> list[GpuCostRow]:
    """The rows summed per model over their days (``day`` is the first day)."""
    totals: dict[str, GpuCostRow] = {}
    for r in rows:
        t = totals.setdefault(r.model, GpuCostRow(r.day, r.model))
        t.busy_seconds += r.busy_seconds
        t.idle_seconds += r.idle_seconds
        t.gpu_cost += r.gpu_cost
        t.completed_responses += r.completed_responses
        t.useful_tokens += r.useful_tokens
        t.failed_responses += r.failed_responses
        t.cancelled_responses += r.cancelled_responses
        t.lost_tokens += r.lost_tokens
    return [totals[m] for m in sorted(totals)]
