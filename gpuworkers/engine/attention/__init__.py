"""Paged attention behind one interface, with a backend chosen by device.

``torch``: paged gather or the CPU decode kernel, SDPA for prefill (CPU
and CUDA). ``flashinfer``: FlashInfer's paged prefill/decode wrappers (CUDA
only, optional extra, imported lazily). Each backend has its own metadata
builder (``backend.metadata_builder``), fed the runner's
``CommonAttentionMetadata`` once per step.
"""

from __future__ import annotations

from gpuworkers.engine.attention.metadata import (
    AttentionBackend,
    AttentionMetadataBuilder,
    CommonAttentionMetadata,
)
from gpuworkers.engine.attention.torch_backend import TorchAttentionBackend


def select_backend(
    name: str, device: str, deterministic: bool = False, kv_cache_dtype: str = "auto"
) -> type[AttentionBackend]:
    """The backend class for ``name`` on ``device`` ("auto" picks by device).

    Chosen by device, not by import success: ``import flashinfer`` succeeds
    on CPU-only hosts and fails only on first use. A deterministic engine
    gets the torch backend: only its attention is batch-invariant; so does
    an int8 KV cache: only the torch backend reads one.
    """
    is_cuda = str(device).startswith("cuda")
    if name == "auto":
        torch_only = deterministic or kv_cache_dtype == "int8"
        flashinfer = is_cuda and not torch_only and _flashinfer_installed()
        name = "flashinfer" if flashinfer else "torch"
    if name == "torch":
        return TorchAttentionBackend
    if name == "flashinfer":
        if not is_cuda:
            raise ValueError("the flashinfer attention backend needs a CUDA device")
        from gpuworkers.engine.attention.flashinfer_backend import FlashInferAttentionBackend

        return FlashInferAttentionBackend
    raise ValueError(f"unknown attention backend {name!r}")


def _flashinfer_installed() -> bool:
    import importlib.util

    return importlib.util.find_spec("flashinfer") is not None


__all__ = [
    "AttentionBackend",
    "AttentionMetadataBuilder",
    "CommonAttentionMetadata",
    "select_backend",
]
