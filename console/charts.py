"""Usage rows -> the data the usage page's Chart.js charts draw."""

from __future__ import annotations

from datetime import date, timedelta

# Distinguishable on white, in the order groups appear.
PALETTE = ["#0b62d6", "#d6510b", "#1a8f4c", "#8a3ffc", "#c9184a", "#6c757d", "#b08900"]


def usage_chart(rows: list[dict], *, start: date, end: date) -> dict:
    """Per day and group: total tokens and cost, zeros on days without usage.

    Returns ``{"labels": [...], "tokens": [dataset...], "cost": [dataset...]}``
    where each dataset is ``{"label", "data", "backgroundColor"}``.
    """
    days = [start + timedelta(days=i) for i in range((end - start).days + 1)]
    index = {day: i for i, day in enumerate(days)}
    groups = sorted({row["group"] for row in rows})
    tokens = {g: [0] * len(days) for g in groups}
    cost = {g: [0.0] * len(days) for g in groups}
    for row in rows:
        i = index.get(row["day"])
        if i is None:
            continue
        tokens[row["group"]][i] += row["prompt_tokens"] + row["completion_tokens"]
        cost[row["group"]][i] += float(row["cost"])

    def datasets(series: dict) -> list[dict]:
        return [
            {"label": g, "data": series[g], "backgroundColor": PALETTE[n % len(PALETTE)]}
            for n, g in enumerate(groups)
        ]

    return {
        "labels": [day.isoformat() for day in days],
        "tokens": datasets(tokens),
        "cost": datasets(cost),
    }
