"""Compare a canary version with the stable one: breach or pass.

A metric breaches when the canary is worse than stable by more than the
rollout's tolerance: rates by an absolute margin (0.02 = two points), TTFT
p95 by a ratio. Too few canary requests in a step is neither: the step
waits (the rollout keeps dwelling) until there is evidence either way.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from fleet.selectors import VersionMetrics

DEFAULT_LIMITS: dict[str, float] = {
    "min_requests": 20,
    # Rates may breach on fewer requests than a pass needs.
    "min_breach_requests": 5,
    "error_rate": 0.02,
    "content_filter_rate": 0.02,
    "regenerate_rate": 0.05,
    "ttft_p95_ratio": 1.5,
}
RATE_METRICS = ("error_rate", "content_filter_rate", "regenerate_rate")


@dataclass(slots=True)
class Verdict:
    enough_data: bool
    breaches: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return self.enough_data and not self.breaches


def guardrails_check(
    *, canary: VersionMetrics, stable: VersionMetrics, limits: dict[str, Any]
) -> Verdict:
    limits = {**DEFAULT_LIMITS, **(limits or {})}
    breaches = []
    for metric in RATE_METRICS:
        got, base = getattr(canary, metric), getattr(stable, metric)
        if canary.requests >= limits["min_breach_requests"] and got > base + limits[metric]:
            breaches.append(f"{metric} {got:.3f} vs stable {base:.3f}")
    if canary.ttft_p95_ms is not None and stable.ttft_p95_ms:
        ratio = canary.ttft_p95_ms / stable.ttft_p95_ms
        if canary.requests >= limits["min_requests"] and ratio > limits["ttft_p95_ratio"]:
            breaches.append(f"ttft_p95 {canary.ttft_p95_ms:.0f}ms is {ratio:.2f}x stable")
    # A breach needs fewer requests than a pass: errors hurt users at once.
    return Verdict(enough_data=canary.requests >= limits["min_requests"], breaches=breaches)
