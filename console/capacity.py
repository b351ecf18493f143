"""KV-cache capacity: how many full-length requests fit on one GPU.

Concurrency is bounded by KV memory, not FLOPs. Every token of every
sequence stores a key and a value vector per layer and KV head:

    bytes per token = 2 x layers x kv_heads x head_dim x bytes per element

A request admitted for the full context must have room for all of its
tokens (a full-length reservation). What is left of the GPU after the
weights and the runtime's reserve, divided by one reservation, is the
ceiling on concurrent full-length requests. Lower weight precision leaves
more memory for KV, which is why FP8 and INT4 weights raise concurrency.
Pure Python, no Django: the console's form and the tests call it.
"""

from __future__ import annotations

from dataclasses import dataclass

GIB = 1024**3

# Bytes per weight parameter by storage precision.
WEIGHT_PRECISIONS: dict[str, float] = {"FP16": 2.0, "FP8": 1.0, "INT4": 0.5}


@dataclass(slots=True, frozen=True)
class ModelShape:
    """The parts of a model config that size its KV cache and weights."""

    layers: int
    kv_heads: int
    head_dim: int
    params_billion: float
    context_length: int

    def __post_init__(self) -> None:
        for name in ("layers", "kv_heads", "head_dim", "context_length"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1")
        if self.params_billion <= 0:
            raise ValueError("params_billion must be positive")


@dataclass(slots=True, frozen=True)
class CapacityRow:
    precision: str
    weights_gib: float
    kv_budget_gib: float
    # Full-length reservations that fit at once; 0 when the weights alone
    # do not fit (then kv_budget_gib is negative).
    concurrent_reservations: int
    tokens_in_flight: int


@dataclass(slots=True, frozen=True)
class CapacityReport:
    kv_bytes_per_token: int
    reservation_bytes: int
    rows: list[CapacityRow]

    @property
    def reservation_gib(self) -> float:
        return self.reservation_bytes / GIB


def kv_bytes_per_token(*, layers: int, kv_heads: int, head_dim: int, dtype_bytes: float) -> int:
    """Key and value, for every layer and KV head, at the KV cache's element width."""
    return int(2 * layers * kv_heads * head_dim * dtype_bytes)


def capacity(
    *,
    shape: ModelShape,
    gpu_memory_gib: float,
    kv_dtype_bytes: float = 2.0,
    runtime_reserve_gib: float = 0.0,
    precisions: dict[str, float] = WEIGHT_PRECISIONS,
) -> CapacityReport:
    """Concurrent full-length reservations per weight precision on one GPU."""
    per_token = kv_bytes_per_token(
        layers=shape.layers,
        kv_heads=shape.kv_heads,
        head_dim=shape.head_dim,
        dtype_bytes=kv_dtype_bytes,
    )
    reservation = per_token * shape.context_length
    rows = []
    for precision, bytes_per_param in precisions.items():
        weights = shape.params_billion * 1e9 * bytes_per_param
        budget = gpu_memory_gib * GIB - runtime_reserve_gib * GIB - weights
        fits = max(0, int(budget // reservation)) if budget > 0 else 0
        rows.append(
            CapacityRow(
                precision=precision,
                weights_gib=weights / GIB,
                kv_budget_gib=budget / GIB,
                concurrent_reservations=fits,
                tokens_in_flight=fits * shape.context_length,
            )
        )
    return CapacityReport(kv_bytes_per_token=per_token, reservation_bytes=reservation, rows=rows)


def shape_from_config(config: dict, *, params_billion: float) -> ModelShape:
    """A ModelShape from a Hugging Face config.json (Llama-style keys).

    Models without grouped-query attention have no num_key_value_heads:
    every attention head then has its own K and V.
    """
    heads = int(config["num_attention_heads"])
    head_dim = int(config.get("head_dim") or config["hidden_size"] // heads)
    return ModelShape(
        layers=int(config["num_hidden_layers"]),
        kv_heads=int(config.get("num_key_value_heads") or heads),
        head_dim=head_dim,
        params_billion=params_billion,
        context_length=int(config.get("max_position_embeddings", 2048)),
    )
