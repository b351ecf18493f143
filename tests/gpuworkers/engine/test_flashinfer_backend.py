"""The FlashInfer backend against the torch backend, on a CUDA device.

Marked gpu: bin/test deselects these, and they skip themselves on a host
without CUDA or without the optional ``flashinfer`` package. No session of
this project has had a GPU to run them on yet (docs/benchmarks.md, "GPU
check, prepared"); they are the check a GPU session runs first.
"""

from __future__ import annotations

import importlib.util

import pytest
import torch

from gpuworkers.engine import LLMEngine, SamplingParams

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
    pytest.mark.skipif(
        importlib.util.find_spec("flashinfer") is None, reason="needs the flashinfer extra"
    ),
]


def build(demo_dir, backend: str, **options) -> LLMEngine:
    return LLMEngine.from_pretrained(
        demo_dir,
        dtype="bfloat16",
        device="cuda",
        attention_backend=backend,
        kv_cache_bytes=256 << 20,
        **options,
    )


def test_first_token_logprobs_agree_with_the_torch_backend(demo_dir, chat_prompts):
    """One batched prefill through FlashInfer's paged prefill wrapper."""
    params = SamplingParams(max_tokens=1, temperature=0.0, logprobs=True)
    flash = build(demo_dir, "flashinfer").generate(chat_prompts, params)
    plain = build(demo_dir, "torch").generate(chat_prompts, params)
    for a, b in zip(flash, plain, strict=True):
        (first_a,), (first_b,) = a.choices[0].logprobs, b.choices[0].logprobs
        assert first_a.token_id == first_b.token_id
        assert abs(first_a.logprob - first_b.logprob) < 0.1


@pytest.mark.parametrize("options", [{}, {"max_num_batched_tokens": 32}])
def test_greedy_text_agrees_with_the_torch_backend(demo_dir, chat_prompts, options):
    """Decode and (with a 32-token budget) chunked prefill through FlashInfer's
    paged wrappers; bfloat16 may flip a late token, so only the first eight
    tokens of each reply are compared."""
    params = SamplingParams(max_tokens=8, temperature=0.0)
    flash_engine = build(demo_dir, "flashinfer", **options)
    assert flash_engine.runner.backend.name == "flashinfer"
    flash = flash_engine.generate(chat_prompts, params)
    plain = build(demo_dir, "torch", **options).generate(chat_prompts, params)
    agreeing = sum(a.token_ids == b.token_ids for a, b in zip(flash, plain, strict=True))
    assert agreeing >= len(chat_prompts) - 1
    assert flash_engine.stats()["kv_blocks_used"] == 0
