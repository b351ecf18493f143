"""The engine's scheduling options for a worker, and for each request.

Tier weights (fair share) come from the control snapshot like every other
setting a worker reads; the weights the process was started with (the
gpuworker command's ``--tier-weights``, the embedded engine's tier rows)
stand in only while no snapshot has been published (a first start). With
neither, the engine keeps its built-in defaults.

Per request, who it is for comes from the wire request, never from a
lookup: the tier and tenant it was admitted under.
"""

from __future__ import annotations

from typing import Any

from wire.requests import GenerationRequest
from wire.snapshot import Snapshot


def tier_weights_parse(text: str) -> dict[str, float]:
    """``"enterprise=0.5,pro=0.35,free=0.15"`` -> a dict; ValueError names the fault."""
    weights: dict[str, float] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        name, sep, value = item.partition("=")
        if not sep or not name.strip():
            raise ValueError(f"expected TIER=WEIGHT, not {item!r}")
        try:
            weight = float(value)
        except ValueError:
            raise ValueError(f"weight of {name.strip()!r} is not a number: {value!r}") from None
        if not weight > 0:
            raise ValueError(f"weight of {name.strip()!r} must be positive")
        weights[name.strip()] = weight
    return weights


def engine_scheduling_options(
    policy: str,
    *,
    snapshot: Snapshot | None,
    fallback_weights: dict[str, float] | None = None,
) -> dict:
    """``scheduling_policy`` and, under fair share, ``tier_weights``.

    The snapshot's weights win; ``fallback_weights`` apply only without one.
    """
    options: dict = {"scheduling_policy": policy}
    if policy == "fair":
        weights = (snapshot.tier_weights() if snapshot is not None else None) or fallback_weights
        if weights:
            options["tier_weights"] = dict(weights)
    return options


def request_scheduling(request: GenerationRequest) -> dict[str, Any]:
    """``LLMEngine.add_request``'s scheduling arguments for ``request``:
    priority, tier, tenant (the engine's fair share between tenants inside a
    tier) and service class (priority, default, flex, batch), all from the
    wire request."""
    tenant = None if request.tenant_id is None else str(request.tenant_id)
    return {
        "priority": request.priority,
        "tier": request.tier,
        "tenant": tenant,
        "service_class": request.service_class.value,
    }
