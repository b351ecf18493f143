"""A decode step's whole layer stack in one compiled call (decode_layers.cpp).

The Python layer loop calls about ten kernels per layer through torch
modules, views and ctypes; at batch 1 on the demo model that Python cost
more than the kernels' own work. Where every piece of a step has a
compiled kernel (tile linears with SwiGLU, the fused norms and rotary,
the paged decode kernel over the pool) and every token of the
step is a decode row, ``DecodeLayers`` runs the same kernels in the same
order from C++: the same bits, one ctypes call. The linears may be
bfloat16 or weight-only int8 tiles (``ENGINE_QUANTIZATION=int8``) and the
pool bfloat16 or int8 (``ENGINE_KV_CACHE_DTYPE=int8``): the loop calls the
matching kernels. Anything else (prefill chunks, oneDNN or torch linears,
another pool dtype, no compiler) keeps the Python loop.
``GPUWORKERS_DECODE_LAYERS=0`` switches it off.
"""

from __future__ import annotations

import os

import torch

from gpuworkers.engine.cpu.int8_linear import Int8AmxLinear, Int8Dpbf16Linear
from gpuworkers.engine.cpu.tile_linear import AmxLinear, Dpbf16Linear

ENV_SWITCH = "GPUWORKERS_DECODE_LAYERS"

# decode_layers.cpp's linear kinds, by the modules that hold the weights.
LINEAR_KINDS = {Dpbf16Linear: 0, AmxLinear: 1, Int8Dpbf16Linear: 2, Int8AmxLinear: 3}


def _pointer(t: torch.Tensor | None) -> int:
    return t.data_ptr() if t is not None else 0


class DecodeLayers:
    """The model's layers bound once to the compiled loop; ``__call__``
    runs them for one step."""

    def __init__(self, lib, model):
        self.fn = lib.decode_layers
        cfg = model.cfg
        first = model.layers[0]
        self.linear_kind = LINEAR_KINDS[type(first.attn.qkv)]
        self.hidden = cfg.hidden_size
        self.q_size = first.attn.q_size
        self.kv_size = first.attn.kv_size
        self.intermediate = first.mlp.intermediate
        self.num_heads = cfg.num_heads
        self.num_kv_heads = cfg.num_kv_heads
        self.head_dim = cfg.head_dim
        self.eps = first.input_norm.eps
        self.rotary = model.rotary
        # Per layer, decode_layers.cpp's LayerWeights: twelve pointers in its
        # order (the four scales null for bfloat16 weights).
        rows = []
        for layer in model.layers:
            attn, mlp = layer.attn, layer.mlp
            linears = (attn.qkv, attn.o, mlp.gate_up, mlp.down)
            rows.append(
                [
                    _pointer(layer.input_norm.weight),
                    _pointer(layer.post_attn_norm.weight),
                    _pointer(attn.qkv.packed_weight),
                    _pointer(attn.qkv.bias),
                    _pointer(attn.o.packed_weight),
                    _pointer(attn.o.bias),
                    _pointer(mlp.gate_up.packed_weight),
                    _pointer(mlp.down.packed_weight),
                ]
                + [_pointer(getattr(m, "scales", None)) for m in linears]
            )
        # A plain int64 array of pointers: the C struct's layout.
        self.weights = torch.tensor(rows, dtype=torch.int64)
        # The model's tensors must outlive the pointers: hold the model's
        # modules (they own them) for as long as this object lives.
        self._layers = model.layers

    @classmethod
    def build(cls, lib, model) -> DecodeLayers | None:
        """Bound to ``model`` where every layer fits the compiled loop, else None."""
        if lib is None or os.environ.get(ENV_SWITCH, "1") == "0":
            return None
        if not hasattr(lib, "decode_layers"):
            return None
        if not _fits(model):
            return None
        return cls(lib, model)

    def applies(self, meta, kv_cache: torch.Tensor, num_tokens: int) -> bool:
        """Whether this step can run here: all tokens decode rows of the
        bound decode kernel, nothing else to attend, a bfloat16 pool or the
        int8 one the kernel was made for."""
        bound = getattr(meta, "decode_kernel", None)
        if bound is None:
            return False
        pool = torch.int8 if bound.kernel.kv_int8 else torch.bfloat16
        return (
            meta.num_decodes == num_tokens
            and not meta.prefills
            and not meta.decode_groups
            and meta.slot_blocks is None
            and kv_cache.dtype == pool
            and kv_cache.is_contiguous()
        )

    def __call__(
        self,
        residual: torch.Tensor,  # [tokens, hidden] bfloat16 embeddings, becomes the residual
        positions: torch.Tensor,
        kv_cache: torch.Tensor,
        meta,
    ) -> torch.Tensor:
        """Runs every layer; returns the last layer's output (``residual``
        then holds the residual stream before it), as the Python loop's
        last ``(x, residual)``."""
        rows = residual.shape[0]
        new = residual.new_empty
        delta = new((rows, self.hidden))
        normed = new((rows, self.hidden))
        qkv = new((rows, self.q_size + 2 * self.kv_size))
        attn = new((rows, self.q_size))
        act = new((rows, self.intermediate))
        bound = meta.decode_kernel
        kernel = bound.kernel
        positions = positions.contiguous()
        status = self.fn(
            self.linear_kind,
            kernel.kv_int8,
            len(self._layers),
            self.weights.data_ptr(),
            rows,
            self.hidden,
            self.q_size,
            self.kv_size,
            self.intermediate,
            self.eps,
            residual.data_ptr(),
            delta.data_ptr(),
            normed.data_ptr(),
            qkv.data_ptr(),
            attn.data_ptr(),
            act.data_ptr(),
            positions.data_ptr(),
            self.rotary.cos.data_ptr(),
            self.rotary.sin.data_ptr(),
            kv_cache.data_ptr(),
            kv_cache.stride(0),
            kv_cache.stride(1),
            kv_cache.stride(2),
            kernel.head_stride,
            meta.slot_mapping.data_ptr(),
            bound.tables.data_ptr(),
            bound.tables.stride(0),
            _pointer(bound.rows),
            bound.lens.data_ptr(),
            kernel.num_heads,
            kernel.num_kv_heads,
            kernel.head_dim,
            kernel.block_size,
            kernel.scale,
        )
        if status:
            raise ValueError("no compiled decode kernel for this shape")
        return delta


def _fits(model) -> bool:
    """Every layer has the pieces the compiled loop calls, of one tile kind."""
    layers = getattr(model, "layers", None)
    rotary = getattr(model, "rotary", None)
    if not layers or rotary is None or rotary.fused is None:
        return False
    if rotary.cos.dtype != torch.bfloat16:
        return False
    kind = type(layers[0].attn.qkv)
    if kind not in LINEAR_KINDS:
        return False
    eps = layers[0].input_norm.eps
    for layer in layers:
        attn, mlp = layer.attn, layer.mlp
        linears = (attn.qkv, attn.o, mlp.gate_up, mlp.down)
        if any(type(m) is not kind for m in linears):
            return False
        if not getattr(mlp, "gate_up_activated", False) or not mlp.gate_up.swiglu:
            return False
        if mlp.down.bias is not None or any(m.swiglu for m in (attn.qkv, attn.o, mlp.down)):
            return False
        if attn.head_dim * (attn.num_heads + attn.num_kv_heads) != attn.q_size + attn.kv_size:
            return False
        if layer.input_norm.eps != eps or layer.post_attn_norm.eps != eps:
            return False
        for norm in (layer.input_norm, layer.post_attn_norm):
            if (
                norm.fused is None
                or norm.weight.dtype != torch.bfloat16
                or not norm.weight.is_contiguous()
            ):
                return False
        if any(not m.packed_weight.is_contiguous() for m in linears):
            return False
    return True
