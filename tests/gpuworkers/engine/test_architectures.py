"""Llama, Mistral and Qwen2 checkpoints (tiny, random, made on the fly) load
and decode exactly like transformers; float16 and bfloat16 run too.

The demo model covers Llama/SmolLM2 at full size; these cover the other
architectures' differences (Qwen2's q/k/v biases, untied heads) cheaply.
"""

from __future__ import annotations

import shutil

import pytest
import torch

from gpuworkers.engine import LLMEngine, SamplingParams

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")


def make_checkpoint(tmp_path, demo_dir, architecture: str):
    import transformers

    common = dict(
        vocab_size=49152,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        tie_word_embeddings=False,
        eos_token_id=2,
        bos_token_id=1,
    )
    config_cls, model_cls = {
        "llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM),
        "mistral": (transformers.MistralConfig, transformers.MistralForCausalLM),
        "qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM),
    }[architecture]
    torch.manual_seed(0)
    model = model_cls(config_cls(**common)).eval()
    if architecture == "qwen2":
        # Random init leaves biases at zero; make them count.
        with torch.no_grad():
            for layer in model.model.layers:
                for proj in (
                    layer.self_attn.q_proj,
                    layer.self_attn.k_proj,
                    layer.self_attn.v_proj,
                ):
                    proj.bias.normal_(0, 0.5)
    directory = tmp_path / architecture
    model.save_pretrained(directory)
    for name in TOKENIZER_FILES:
        if (demo_dir / name).exists():
            shutil.copy(demo_dir / name, directory / name)
    return directory, model


@pytest.mark.parametrize("architecture", ["llama", "mistral", "qwen2"])
def test_tiny_checkpoint_matches_transformers(tmp_path, demo_dir, architecture):
    directory, reference = make_checkpoint(tmp_path, demo_dir, architecture)
    engine = LLMEngine.from_pretrained(directory, dtype="float32", kv_cache_bytes=8 << 20)
    prompts = [[1, 500, 600, 700], [1, 42] * 9, list(range(100, 137))]
    params = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
    outputs = engine.generate(prompts, params)
    for prompt, output in zip(prompts, outputs, strict=True):
        with torch.inference_mode():
            expected = reference.generate(
                torch.tensor([prompt]),
                attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                max_new_tokens=12,
                min_new_tokens=12,
                do_sample=False,
                pad_token_id=2,
            )[0, len(prompt) :].tolist()
        assert output.token_ids == expected, architecture
    assert engine.stats()["kv_blocks_used"] == 0


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_half_precisions_run_and_stay_close(tmp_path, demo_dir, dtype):
    """Lower precisions decode; their first-step logits stay near float32's."""
    directory, _ = make_checkpoint(tmp_path, demo_dir, "llama")
    prompt = list(range(200, 240))
    full = LLMEngine.from_pretrained(directory, dtype="float32", kv_cache_bytes=8 << 20)
    half = LLMEngine.from_pretrained(directory, dtype=dtype, kv_cache_bytes=8 << 20)
    params = SamplingParams(max_tokens=1, temperature=0.0, logprobs=True, top_logprobs=5)
    exact = full.generate([prompt], params)[0].choices[0].logprobs[0]
    approx = half.generate([prompt], params)[0].choices[0].logprobs[0]
    assert half.runner.kv_cache.dtype == getattr(torch, dtype)
    assert approx.logprob == pytest.approx(exact.logprob, abs=0.1)
    out = half.generate([prompt], SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True))
    assert len(out[0].token_ids) == 8


def test_demo_model_answers_the_capital_of_france(make_engine, tokenizer):
    """What a new user tries first: float32 greedy on the chat template."""
    from tokenization.tokenizer import apply_chat_template

    engine = make_engine()
    prompt = apply_chat_template(
        tokenizer, [{"role": "user", "content": "What is the capital of France?"}]
    )
    out = engine.generate([prompt], SamplingParams(max_tokens=20, temperature=0.0))
    assert out[0].text == "The capital of France is Paris."
    assert out[0].finish_reason == "stop"
