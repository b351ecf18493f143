"""Reads for the served-model catalog.

Plain synchronous ORM functions; async callers wrap them with asgiref's
``sync_to_async`` so the queries run off the event loop.
"""

from pathlib import Path

from django.core.cache import cache
from django.db.models import QuerySet

from inference.models import ServedModel
from inference.relay import ResponseRoute, route_cache_key
from tenants.models import Tier


def served_model_list(*, tier: Tier) -> QuerySet[ServedModel]:
    """Active models that keys on ``tier`` may call, by name."""
    return ServedModel.objects.filter(is_active=True, tiers=tier).order_by("name")


def served_model_get(*, name: str, tier: Tier) -> ServedModel | None:
    """The active model called ``name`` if ``tier`` may use it, else None.

    Unknown, inactive and tier-restricted models are all None: callers
    answer the same 404 so a key cannot probe other tiers' catalogs.
    """
    return served_model_list(tier=tier).filter(name=name).first()


def served_model_dir(*, model: ServedModel) -> Path:
    """The model's Hugging Face directory (tokenizer, config, weights).

    A blank path is the demo model: it is converted from its GGUF file on
    first use, so a fresh checkout needs no manual step.
    """
    if model.path:
        return Path(model.path)
    from gpuworkers.engine.convert_gguf import ensure_demo_model

    # Returns at once when the converted directory is complete.
    return ensure_demo_model()


async def response_route_get(*, response_id: str, tenant_id: int) -> ResponseRoute | None:
    """The route of ``response_id`` if it belongs to the tenant, else None.

    Another tenant's response is indistinguishable from an unknown or
    expired one.
    """
    data = await cache.aget(route_cache_key(response_id))
    if not data or data.get("tenant_id") != tenant_id:
        return None
    return ResponseRoute.from_dict(data)
