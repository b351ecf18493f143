"""The compiled decode layer loop (engine/cpu/decode_layers.py) against the
Python layer loop it replaces: the same logits, bit for bit, on the same
step, with bfloat16 or weight-only int8 linears and a bfloat16 or int8 KV
pool; and its switches back to the Python loop.

It needs bfloat16 tile linears (AMX or AVX512_BF16); on other CPUs the
model never binds it and the tests that need it skip.
"""

from __future__ import annotations

import pytest
import torch

from gpuworkers.engine import LLMEngine, SamplingParams
from gpuworkers.engine.cpu.decode_layers import ENV_SWITCH
from gpuworkers.engine.cpu.tile_linear import ENV_SWITCH as TILE_SWITCH
from gpuworkers.engine.models.loader import load_model

NO_TILE_KERNELS = "no AMX or AVX512_BF16 tile linears here: the Python layer loop runs"


def bf16_engine(demo_dir, **options) -> LLMEngine:
    return LLMEngine.from_pretrained(
        demo_dir, dtype="bfloat16", kv_cache_bytes=64 << 20, max_model_len=2048, **options
    )


def prompts() -> list[list[int]]:
    # Lengths across block boundaries (16-token blocks).
    lengths = [3, 17, 40, 70]
    return [[(101 + 37 * i + 11 * n) % 40000 + 100 for i in range(n)] for n in lengths]


@pytest.mark.parametrize(
    ("quantization", "kv_cache_dtype"),
    [(None, "auto"), ("int8", "auto"), (None, "int8"), ("int8", "int8")],
    ids=["bf16", "int8-weights", "int8-kv", "int8-both"],
)
def test_compiled_loop_gives_the_python_loops_logits_on_the_same_steps(
    demo_dir, quantization, kv_cache_dtype
):
    """Every pure-decode step runs twice, the Python loop then the
    compiled one, on the same inputs (both write the same K/V to the same
    slots); their logits must be equal bit for bit. Deterministic steps
    too, where every prompt token is a decode row reading its sequence's
    table."""
    engine = bf16_engine(demo_dir, quantization=quantization, kv_cache_dtype=kv_cache_dtype)
    model = engine.runner.model
    fused = model.decode_layers
    if fused is None:
        pytest.skip(NO_TILE_KERNELS)
    assert "decode-layers" in engine.cpu_fast_paths
    if quantization:
        assert fused.linear_kind in (2, 3)  # the int8 tile kinds
    forward = model.forward
    compared = []

    def both_loops(input_ids, positions, kv_cache, meta, backend, logits_indices):
        if not fused.applies(meta, kv_cache, input_ids.shape[0]):
            return forward(input_ids, positions, kv_cache, meta, backend, logits_indices)
        model.decode_layers = None
        try:
            python = forward(input_ids, positions, kv_cache, meta, backend, logits_indices)
        finally:
            model.decode_layers = fused
        compiled = forward(input_ids, positions, kv_cache, meta, backend, logits_indices)
        compared.append((input_ids.shape[0], torch.equal(python, compiled)))
        return compiled

    model.forward = both_loops
    for deterministic in (False, True):
        params = SamplingParams(
            max_tokens=8, temperature=0.0, ignore_eos=True, deterministic=deterministic
        )
        engine.generate(prompts(), params)
        engine.generate(prompts()[:1], params)
    # Steps of all four sequences and of one (with speculation, rows may be
    # several tokens per sequence); prefill steps kept the Python loop.
    assert len(compared) >= 4
    assert all(equal for _, equal in compared), compared


def test_switched_off_engine_generates_the_same_tokens(demo_dir, monkeypatch):
    """GPUWORKERS_DECODE_LAYERS=0 keeps the Python loop; greedy tokens agree."""
    on = bf16_engine(demo_dir)
    if on.runner.model.decode_layers is None:
        pytest.skip(NO_TILE_KERNELS)
    assert "decode-layers" in on.cpu_fast_paths
    monkeypatch.setenv(ENV_SWITCH, "0")
    off = bf16_engine(demo_dir)
    assert off.runner.model.decode_layers is None
    assert "decode-layers" not in off.cpu_fast_paths
    params = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
    expected = [o.token_ids for o in off.generate(prompts()[:2], params)]
    assert [o.token_ids for o in on.generate(prompts()[:2], params)] == expected


def test_models_without_tile_linears_or_fast_paths_keep_the_python_loop(demo_dir, monkeypatch):
    """oneDNN-packed linears, float32 and plain torch never bind it."""
    plain = load_model(demo_dir, "bfloat16", "cpu", 2048, cpu_fast_paths=False)[0]
    assert plain.decode_layers is None
    fp32 = load_model(demo_dir, "float32", "cpu", 2048)[0]
    assert fp32.decode_layers is None
    monkeypatch.setenv(TILE_SWITCH, "0")
    packed = load_model(demo_dir, "bfloat16", "cpu", 2048)[0]
    assert packed.decode_layers is None
    assert "decode-layers" not in packed.cpu_fast_paths
