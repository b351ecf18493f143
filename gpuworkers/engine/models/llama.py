"""Llama-family decoder (Llama, Mistral, Qwen2, SmolLM2) over a paged KV cache.

The whole step's tokens (decodes and prefill chunks) go through each layer
as one flat [tokens, hidden] batch; only attention looks at sequences.
"""

from __future__ import annotations

import torch
from torch import nn

from gpuworkers.engine.attention.metadata import AttentionBackend
from gpuworkers.engine.models.batch_invariant import linear
from gpuworkers.engine.models.config import ModelConfig
from gpuworkers.engine.models.layers import MLP, RMSNorm, RotaryEmbedding


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.num_heads = cfg.num_heads
        self.num_kv_heads = cfg.num_kv_heads
        self.head_dim = cfg.head_dim
        self.q_size = cfg.num_heads * cfg.head_dim
        self.kv_size = cfg.num_kv_heads * cfg.head_dim
        # q, k and v fused into one matmul.
        self.qkv = nn.Linear(
            cfg.hidden_size, self.q_size + 2 * self.kv_size, bias=cfg.attention_bias
        )
        self.o = nn.Linear(self.q_size, cfg.hidden_size, bias=False)

    def forward(self, x, positions, rotary, k_cache, v_cache, meta, backend):
        qkv = linear(self.qkv, x, meta.deterministic)
        q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q = q.view(-1, self.num_heads, self.head_dim)
        k = k.view(-1, self.num_kv_heads, self.head_dim)
        v = v.view(-1, self.num_kv_heads, self.head_dim)
        q, k = rotary(positions, q, k)
        out = backend.forward(q, k, v, k_cache, v_cache, meta)
        return linear(self.o, out.reshape(-1, self.q_size), meta.deterministic)


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.input_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.attn = Attention(cfg)
        self.post_attn_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = MLP(cfg.hidden_size, cfg.intermediate_size)

    def forward(self, x, residual, positions, rotary, k_cache, v_cache, meta, backend):
        """(this layer's output delta, the residual stream before it).

        The residual add is deferred into the next norm (``add_and_norm``),
        so that on CPU it fuses with it; the arithmetic is the same.
        """
        if residual is None:
            residual, normed = x, self.input_norm(x)
        else:
            residual, normed = self.input_norm.add_and_norm(residual, x)
        x = self.attn(normed, positions, rotary, k_cache, v_cache, meta, backend)
        residual, normed = self.post_attn_norm.add_and_norm(residual, x)
        return self.mlp(normed, meta.deterministic), residual


class LlamaForCausalLM(nn.Module):
    # engine.cpu.DecodeLayers where the CPU fast paths bound one: pure
    # decode steps run the layer stack in one compiled call.
    decode_layers = None

    def __init__(self, cfg: ModelConfig, dtype: torch.dtype):
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        self.rotary = RotaryEmbedding(
            cfg.head_dim, cfg.max_position_embeddings, cfg.rope_theta, cfg.rope_scaling, dtype
        )

    @torch.inference_mode()
    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        kv_cache: torch.Tensor,  # [layers, 2, blocks, *backend.cache_block_shape()]
        # backend.metadata_builder.build(...), this step's; its
        # ``deterministic`` switches the linears to batch-invariant tiles.
        meta: object,
        backend: AttentionBackend,
        logits_indices: torch.Tensor,
    ) -> torch.Tensor:
        """float32 logits for the tokens at ``logits_indices``."""
        x, residual = self.embed(input_ids), None
        fused = self.decode_layers
        if fused is not None and fused.applies(meta, kv_cache, x.shape[0]):
            # Every token a decode row: the compiled loop, the same kernels
            # in the same order (engine/cpu/decode_layers.py).
            residual = x
            x = fused(residual, positions, kv_cache, meta)
        else:
            for i, layer in enumerate(self.layers):
                x, residual = layer(
                    x,
                    residual,
                    positions,
                    self.rotary,
                    kv_cache[i, 0],
                    kv_cache[i, 1],
                    meta,
                    backend,
                )
        # Only sampled positions need the last residual add, the final norm
        # and the LM head.
        x = self.norm(residual[logits_indices] + x[logits_indices])
        return linear(self.lm_head, x, meta.deterministic).float()

    # Weights ----------------------------------------------------------

    def load_hf_state_dict(self, tensors: dict[str, torch.Tensor], assign: bool = False) -> None:
        """Load a Hugging Face checkpoint's tensors, fusing q/k/v and gate/up.

        ``assign`` adopts the tensors instead of copying (meta-device models).
        """
        own = {}
        prefix = "model."
        own["embed.weight"] = tensors[prefix + "embed_tokens.weight"]
        own["norm.weight"] = tensors[prefix + "norm.weight"]
        head = tensors.get("lm_head.weight")
        if head is None or self.cfg.tie_word_embeddings:
            head = own["embed.weight"]
        own["lm_head.weight"] = head
        for i in range(self.cfg.num_layers):
            src = f"{prefix}layers.{i}."
            dst = f"layers.{i}."
            own[dst + "input_norm.weight"] = tensors[src + "input_layernorm.weight"]
            own[dst + "post_attn_norm.weight"] = tensors[src + "post_attention_layernorm.weight"]
            own[dst + "attn.qkv.weight"] = torch.cat(
                [tensors[f"{src}self_attn.{p}_proj.weight"] for p in "qkv"]
            )
            if self.cfg.attention_bias:
                own[dst + "attn.qkv.bias"] = torch.cat(
                    [tensors[f"{src}self_attn.{p}_proj.bias"] for p in "qkv"]
                )
            own[dst + "attn.o.weight"] = tensors[src + "self_attn.o_proj.weight"]
            own[dst + "mlp.gate_up.weight"] = torch.cat(
                [tensors[src + "mlp.gate_proj.weight"], tensors[src + "mlp.up_proj.weight"]]
            )
            own[dst + "mlp.down.weight"] = tensors[src + "mlp.down_proj.weight"]
        missing, unexpected = self.load_state_dict(own, strict=False, assign=assign)
        # Buffers (rotary tables) are not in checkpoints; anything else is a bug.
        missing = [m for m in missing if not m.startswith("rotary.")]
        if missing or unexpected:
            raise ValueError(f"checkpoint mismatch: missing {missing}, unexpected {unexpected}")
