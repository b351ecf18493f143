"""Build a model from a Hugging Face directory of safetensors files."""

from __future__ import annotations

import time
from pathlib import Path

import torch
from safetensors import safe_open

from gpuworkers.engine.cpu import cpu_library, enable_cpu_fast_paths
from gpuworkers.engine.models import ARCHITECTURES
from gpuworkers.engine.models.config import ModelConfig
from gpuworkers.engine.models.layers import RotaryEmbedding
from gpuworkers.engine.quantization import quantize_linears

TORCH_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def load_model(
    model_dir: str | Path,
    dtype: str,
    device: str,
    max_positions: int,
    cpu_fast_paths: bool = True,
    quantization: str | None = None,
):
    """Return (model, ModelConfig) with weights on ``device`` in ``dtype``.

    ``cpu_fast_paths``: on CPU in bfloat16, pre-pack the linear layers for
    oneDNN and use the fused element-wise kernels (engine/cpu/).
    ``quantization``: "int8" swaps every linear for a weight-only int8 one
    (engine/quantization.py), on the compiled int8 tile kernels where the
    fast paths run in bfloat16, else on torch's int8 matmul.
    """
    model_dir = Path(model_dir)
    cfg = ModelConfig.from_dir(model_dir)
    cls = ARCHITECTURES.get(cfg.architecture)
    if cls is None:
        raise ValueError(
            f"unsupported architecture {cfg.architecture!r}; supported: {sorted(ARCHITECTURES)}"
        )
    torch_dtype = TORCH_DTYPES[dtype]
    files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors in {model_dir}")
    started = time.monotonic()
    tensors: dict[str, torch.Tensor] = {}
    for path in files:
        with safe_open(str(path), framework="pt", device="cpu") as handle:
            for name in handle.keys():  # noqa: SIM118 (safe_open is not a dict)
                tensors[name] = handle.get_tensor(name).to(device=device, dtype=torch_dtype)
    # Build on the meta device: random init of the real parameters would be
    # thrown away by the checkpoint anyway.
    with torch.device("meta"):
        model = cls(cfg, torch_dtype)
    model.rotary = RotaryEmbedding(
        cfg.head_dim, max_positions, cfg.rope_theta, cfg.rope_scaling, torch_dtype
    )
    model.load_hf_state_dict(tensors, assign=True)
    model.rotary.to(device)
    model.eval()
    quantized = []
    if quantization == "int8":
        fast = cpu_fast_paths and torch.device(device).type == "cpu"
        lib = cpu_library() if fast and torch_dtype == torch.bfloat16 else None
        kernel = quantize_linears(model, lib)
        swiglu = any(getattr(m, "gate_up_activated", False) for m in model.modules())
        quantized = [f"int8-{kernel}-linears"] * (kernel != "torch")
        quantized += [f"int8-{kernel}-swiglu"] * (kernel != "torch" and swiglu)
    elif quantization is not None:
        raise ValueError(f"unknown quantization {quantization!r}")
    model.cpu_fast_paths = quantized + (
        enable_cpu_fast_paths(model, torch_dtype, device) if cpu_fast_paths else []
    )
    model.load_seconds = time.monotonic() - started
    return model, cfg
