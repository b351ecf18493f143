"""Embedded mode's worker, built from settings: the demo model in a thread.

``config.apps`` registers ``start`` with the dispatcher, so the request
path starts the engine on first use without importing the worker; Daphne
starts it with the server (``config.asgi``) so it warms up before the first
chat; until it is ready, dispatch answers 503 ``model_warming_up``.
"""

from __future__ import annotations

import logging
import threading

from django.conf import settings
from django.db import connection

from fleet.snapshot import snapshot_current
from gpuworkers import embedded
from gpuworkers.scheduling import engine_scheduling_options
from tenants.selectors import tier_scheduling_weights

logger = logging.getLogger(__name__)


def start() -> embedded.EmbeddedWorker:
    """The process's embedded worker, started on first call."""
    return embedded.ensure_started(_spec)


def _spec() -> embedded.EmbeddedSpec:
    return embedded.EmbeddedSpec(
        model_name=settings.DEMO_MODEL_NAME,
        load_engine=_load_engine,
        hourly_price=settings.WORKER_HOURLY_PRICE,
    )


def _load_engine():
    from gpuworkers.engine import LLMEngine
    from gpuworkers.engine.convert_gguf import ensure_demo_model

    if settings.ENGINE_THREADS:
        import torch

        torch.set_num_threads(settings.ENGINE_THREADS)
    return LLMEngine.from_pretrained(
        ensure_demo_model(),
        dtype=settings.ENGINE_DTYPE,
        kv_cache_bytes=settings.ENGINE_KV_CACHE_MB << 20,
        kv_cache_dtype=settings.ENGINE_KV_CACHE_DTYPE,
        max_num_batched_tokens=settings.ENGINE_MAX_BATCHED_TOKENS,
        quantization=settings.ENGINE_QUANTIZATION,
        model_id=settings.DEMO_MODEL_NAME,
        batch_step_tokens=settings.ENGINE_BATCH_STEP_TOKENS,
        batch_yield_seconds=settings.ENGINE_BATCH_YIELD_SECONDS,
        **scheduling_options(),
    )


def scheduling_options() -> dict:
    """The engine's scheduling options: the snapshot's tier weights, else the rows'."""
    policy = settings.ENGINE_SCHEDULING_POLICY
    snapshot = snapshot_current()
    rows = None
    if policy == "fair" and (snapshot is None or not snapshot.tier_weights()):
        rows = _tier_rows_weights()
    return engine_scheduling_options(policy, snapshot=snapshot, fallback_weights=rows)


def _tier_rows_weights() -> dict[str, float] | None:
    try:
        return tier_scheduling_weights()
    except Exception:
        # The engine must start even with the database down: defaults then.
        logger.warning("tier weights unavailable; using the engine's defaults", exc_info=True)
        return None
    finally:
        if threading.current_thread() is not threading.main_thread():
            # The engine thread never queries again: do not keep a database
            # connection open for its lifetime.
            connection.close()
