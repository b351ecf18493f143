"""The decoder shape read from a Hugging Face config.json."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

DTYPES = {"float32": 4, "bfloat16": 2, "float16": 2}
# An int8 KV pool's float32 scale per (token, kv head) (attention/kv_int8.py).
INT8_SCALE_BYTES = 4


@dataclass(slots=True)
class ModelConfig:
    architecture: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    max_position_embeddings: int
    tie_word_embeddings: bool
    # Qwen2 puts biases on q/k/v; Llama and Mistral do not.
    attention_bias: bool = False
    rope_scaling: dict = field(default_factory=dict)
    sliding_window: int | None = None

    @classmethod
    def from_dir(cls, model_dir: str | Path) -> ModelConfig:
        raw = json.loads((Path(model_dir) / "config.json").read_text())
        return cls.from_dict(raw)

    @classmethod
    def from_dict(cls, raw: dict) -> ModelConfig:
        architecture = (raw.get("architectures") or ["LlamaForCausalLM"])[0]
        heads = raw["num_attention_heads"]
        rope = raw.get("rope_parameters") or raw.get("rope_scaling") or {}
        theta = raw.get("rope_theta", rope.get("rope_theta", 10000.0))
        return cls(
            architecture=architecture,
            vocab_size=raw["vocab_size"],
            hidden_size=raw["hidden_size"],
            intermediate_size=raw["intermediate_size"],
            num_layers=raw["num_hidden_layers"],
            num_heads=heads,
            num_kv_heads=raw.get("num_key_value_heads") or heads,
            head_dim=raw.get("head_dim") or raw["hidden_size"] // heads,
            rms_norm_eps=raw.get("rms_norm_eps", 1e-6),
            rope_theta=float(theta),
            max_position_embeddings=raw.get("max_position_embeddings", 4096),
            tie_word_embeddings=raw.get("tie_word_embeddings", False),
            attention_bias=raw.get("attention_bias", architecture == "Qwen2ForCausalLM"),
            rope_scaling={k: v for k, v in rope.items() if k != "rope_theta"},
            # Mistral always slides; Qwen2 only when use_sliding_window is set.
            sliding_window=raw.get("sliding_window")
            if raw.get("use_sliding_window", architecture == "MistralForCausalLM")
            else None,
        )

    def kv_bytes_per_token(self, dtype: str, kv_cache_dtype: str = "auto") -> int:
        """2 (K and V) x layers x kv_heads x bytes per token and kv head:
        head_dim elements of ``dtype``, or with ``kv_cache_dtype="int8"``
        head_dim bytes and a float32 scale."""
        per_head = self.head_dim * DTYPES[dtype]
        if kv_cache_dtype == "int8":
            per_head = self.head_dim + INT8_SCALE_BYTES
        return 2 * self.num_layers * self.num_kv_heads * per_head
