"""The engine's scheduling settings, from Django settings and the tiers.

Tier weights come from the control snapshot (fleet.snapshot) like every
other setting a worker reads, and from the Tier rows only when no snapshot
has been published yet (a first start, the embedded engine).

The engine package never imports Django; workers (the gpuworker command and
the embedded engine) pass these to ``LLMEngine.from_pretrained``.
"""

from __future__ import annotations

import logging
import threading

from django.conf import settings
from django.db import connection

logger = logging.getLogger(__name__)


def tier_weights() -> dict[str, float] | None:
    """Each tier's ``scheduling_weight``; None (the engine's defaults) when
    neither the snapshot nor the database has any."""
    from fleet.snapshot import snapshot_current

    snapshot = snapshot_current()
    if snapshot is not None and snapshot.tiers:
        weights = {
            name: float(tier.scheduling_weight)
            for name, tier in snapshot.tiers.items()
            if tier.scheduling_weight > 0
        }
        if weights:
            return weights
    return _tier_weights_from_database()


def _tier_weights_from_database() -> dict[str, float] | None:
    from tenants.models import Tier

    try:
        rows = list(Tier.objects.values_list("name", "scheduling_weight"))
    except Exception:
        # A worker must start even with the database down: defaults then.
        logger.warning("tier weights unavailable; using the engine's defaults", exc_info=True)
        return None
    finally:
        if threading.current_thread() is not threading.main_thread():
            # The embedded engine's thread never queries again: do not keep
            # a database connection open for its lifetime.
            connection.close()
    weights = {name: float(weight) for name, weight in rows if weight and weight > 0}
    return weights or None


def engine_scheduling_options(policy: str | None = None) -> dict:
    """``scheduling_policy`` (default settings.ENGINE_SCHEDULING_POLICY) and,
    under fair share, ``tier_weights`` from the Tier rows."""
    options: dict = {"scheduling_policy": policy or settings.ENGINE_SCHEDULING_POLICY}
    if options["scheduling_policy"] == "fair":
        weights = tier_weights()
        if weights:
            options["tier_weights"] = weights
    return options
