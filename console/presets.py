"""Starting points for the capacity calculator: the served demo model and
the design documents' worked example."""

from __future__ import annotations

import logging

from console.capacity import ModelShape
from console.selectors import model_shape_from_dir
from tokenization.files import DEMO_NAME, demo_model_dir

logger = logging.getLogger(__name__)

# The design documents' example: a 70B model with grouped-query attention
# (80 layers, 8 KV heads of 128) on one 80 GiB GPU, 8K-token reservations.
WORKED_EXAMPLE = ModelShape(
    layers=80, kv_heads=8, head_dim=128, params_billion=70, context_length=8192
)


def _values(shape: ModelShape, gpu_memory_gib: float, reserve_gib: float) -> dict:
    return {
        "layers": shape.layers,
        "kv_heads": shape.kv_heads,
        "head_dim": shape.head_dim,
        "params_billion": round(shape.params_billion, 4),
        "context_length": shape.context_length,
        "gpu_memory_gib": gpu_memory_gib,
        "runtime_reserve_gib": reserve_gib,
        "kv_dtype_bytes": "2",
    }


def capacity_presets() -> dict[str, dict]:
    """Presets by key, the served demo model first when its files are present."""
    presets: dict[str, dict] = {}
    directory = demo_model_dir()
    try:
        demo = model_shape_from_dir(directory)
    except (OSError, KeyError, ValueError):
        logger.info("No demo model config at %s for the capacity presets", directory)
    else:
        presets["demo"] = {
            "label": f"{DEMO_NAME} (served demo model, config.json) on a 24 GiB GPU",
            "values": _values(demo, 24, 1),
        }
    presets["70b"] = {
        "label": "70B, 80 layers, 8 KV heads, head_dim 128 on an 80 GiB GPU (worked example)",
        "values": _values(WORKED_EXAMPLE, 80, 0),
    }
    return presets
