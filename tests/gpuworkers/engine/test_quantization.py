"""Weight-only int8 linears (gpuworkers/engine/quantization.py and
engine/cpu/int8_linear.py): the quantization's error bound, every kernel
this machine has against x @ dequantized(W).T, and an int8 engine against
the unquantized one."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from gpuworkers.engine import EngineConfig, LLMEngine
from gpuworkers.engine.cpu import build
from gpuworkers.engine.cpu.int8_linear import Int8AmxLinear, Int8Dpbf16Linear, Int8TileLinear
from gpuworkers.engine.models.layers import MLP
from gpuworkers.engine.quantization import (
    INT8_MAX,
    Int8Linear,
    dequantize_int8,
    quantize_int8,
    quantize_linears,
)
from gpuworkers.engine.sampling_params import SamplingParams
from tests.gpuworkers.engine.linear_helpers import random_linear

LIB = build.cpu_library()


layer = random_linear


def rows_of(count: int, features: int, seed: int, dtype=torch.bfloat16) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(count, features, generator=gen).to(dtype)


def reference(x: torch.Tensor, linear: torch.nn.Linear) -> torch.Tensor:
    """x @ dequantized(W).T + b in float32: what every int8 kernel computes."""
    weight = dequantize_int8(*quantize_int8(linear.weight))
    bias = linear.bias.float() if linear.bias is not None else None
    return F.linear(x.float(), weight, bias)


def test_round_trip_within_half_a_step():
    weight = torch.randn(40, 96, generator=torch.Generator().manual_seed(0)) * 3
    weight[5] = 0.0  # an all-zero row
    weight[7, 11] = -50.0  # an outlier sets its row's scale
    quantized, scales = quantize_int8(weight)
    assert quantized.dtype == torch.int8 and scales.dtype == torch.float32
    assert int(quantized.abs().max()) <= INT8_MAX
    error = (dequantize_int8(quantized, scales) - weight).abs()
    assert bool((error <= scales[:, None] / 2 * (1 + 1e-6)).all())
    # Each row's largest magnitude maps to +-127 (the full range is used).
    nonzero = [r for r in range(40) if r != 5]
    assert bool((quantized[nonzero].abs().amax(dim=1) == INT8_MAX).all())
    assert quantized[7, 11] == -INT8_MAX
    assert bool((quantized[5] == 0).all()) and scales[5] == 1.0
    # Relative to the row's peak, the error is at most 1/254.
    peak = weight.abs().amax(dim=1, keepdim=True).clamp(min=1e-12)
    assert float((error / peak).max()) <= 0.5 / INT8_MAX + 1e-6


@pytest.mark.parametrize("bias", [False, True])
def test_torch_fallback_matches_the_dequantized_product(bias):
    linear = layer(40, 70, bias, seed=1)  # odd shapes: no kernel tile needed
    module = Int8Linear(linear)
    for rows in (1, 5, 33):
        x = rows_of(rows, 70, seed=rows, dtype=torch.float32)
        torch.testing.assert_close(module(x), reference(x, linear), rtol=1e-5, atol=1e-4)
    # bfloat16 rows: computed in float32, rounded once to bfloat16.
    x = rows_of(9, 70, seed=2)
    got = module(x)
    assert got.dtype == torch.bfloat16
    exact = reference(x, linear)
    assert bool(((got.float() - exact).abs() <= exact.abs() * 2.0**-8 + 1e-4).all())
    # Leading dimensions are kept.
    assert module(rows_of(6, 70, seed=3).view(2, 3, 70)).shape == (2, 3, 40)


# An Intel Xeon with AMX runs both kinds (it has AVX512_BF16 too); an AMD
# EPYC Zen 4 the vdpbf16ps kind; a CPU with neither runs Int8Linear only.
@pytest.fixture(
    params=[pytest.param(Int8AmxLinear, id="amx"), pytest.param(Int8Dpbf16Linear, id="dpbf16")]
)
def kind(request):
    if LIB is None or not request.param.bf16_kind.available(LIB):
        pytest.skip(f"this CPU's library has no {request.param.__name__} kernel")
    return request.param


def within_rounding(got: torch.Tensor, exact: torch.Tensor) -> bool:
    """Each output within bfloat16 rounding of the float32 product (the
    float32 sums differ from the reference's only in their order)."""
    return bool(((got.float() - exact).abs() <= exact.abs() * 2.0**-8 + 1e-3).all())


# 1..32 rows: one row block, widened per k step (AMX); 33..64: two blocks;
# more: a widened chunk shared by the blocks.
@pytest.mark.parametrize("rows", [1, 7, 32, 33, 64, 65, 130])
@pytest.mark.parametrize(
    ("out_features", "in_features", "bias"),
    [(40, 64, True), (96, 576, False), (48, 1536, False)],
)
def test_tile_kernel_matches_the_dequantized_product(kind, rows, out_features, in_features, bias):
    linear = layer(out_features, in_features, bias, seed=out_features + in_features)
    module = kind(LIB, linear.to(torch.bfloat16))
    x = rows_of(rows, in_features, seed=rows)
    got = module(x)
    assert got.dtype == torch.bfloat16 and got.shape == (rows, out_features)
    assert within_rounding(got, reference(x, linear.to(torch.bfloat16)))


def test_tile_kernel_rows_do_not_depend_on_the_batch(kind):
    linear = layer(96, 576, True, seed=3).to(torch.bfloat16)
    module = kind(LIB, linear)
    batch = rows_of(70, 576, seed=4)
    together = module(batch)
    for row in (0, 31, 32, 69):
        assert torch.equal(module(batch[row : row + 1]), together[row : row + 1])


def test_tile_kernel_swiglu(kind):
    width = 64
    linear = layer(2 * width, 576, False, seed=5).to(torch.bfloat16)
    module = kind(LIB, linear, swiglu=True)
    x = rows_of(20, 576, seed=6)
    gate_up = reference(x, linear)
    # The kernel rounds gate and up to bfloat16, then silu(gate), then the
    # product, as the unfused bfloat16 passes do.
    gate, up = gate_up.to(torch.bfloat16).float().split(width, dim=1)
    exact = F.silu(gate).to(torch.bfloat16).float() * up
    got = module(x)
    assert got.shape == (20, width)
    assert bool(((got.float() - exact).abs() <= exact.abs() * 2.0**-6 + 2e-2).all())


def test_quantize_linears_without_kernels_swaps_every_linear():
    mlp = MLP(64, 96)
    head = torch.nn.Linear(64, 50, bias=True)
    model = torch.nn.ModuleDict({"mlp": mlp, "head": head})
    x = rows_of(3, 64, seed=7, dtype=torch.float32)
    expected = reference(x, head)
    assert quantize_linears(model, None) == "torch"
    assert not any(isinstance(m, torch.nn.Linear) for m in model.modules())
    assert not mlp.gate_up_activated  # only the tile kernels fuse SwiGLU
    torch.testing.assert_close(model["head"](x), expected, rtol=1e-5, atol=1e-4)


def test_bad_quantization_is_a_clear_error():
    with pytest.raises(ValueError, match=r"unknown quantization 'int4': expected one of int8"):
        EngineConfig(quantization="int4")
    assert EngineConfig(quantization="").quantization is None
    assert EngineConfig(quantization="int8").quantization == "int8"


@pytest.fixture(scope="module")
def engines(demo_dir):
    """The demo model in the engine's default dtype, unquantized and int8."""
    torch.set_num_threads(2)
    options = {"num_kv_blocks": 256, "num_host_blocks": 64, "max_model_len": 2048}
    plain = LLMEngine.from_pretrained(demo_dir, **options)
    int8 = LLMEngine.from_pretrained(demo_dir, quantization="int8", **options)
    return plain, int8


def test_int8_engine_mostly_agrees_with_the_unquantized_one(engines, chat_prompts):
    plain, int8 = engines
    assert int8.config.quantization == "int8"
    model = int8.runner.model
    assert not any(isinstance(m, torch.nn.Linear) for m in model.modules())
    # The tied LM head is an int8 linear of its own; the lookup table is not.
    head = model.lm_head
    weight = head.packed_weight if isinstance(head, Int8TileLinear) else head.quantized
    assert weight.dtype == torch.int8
    assert model.embed.weight.dtype == plain.runner.model.embed.weight.dtype
    prompts = chat_prompts[:5]
    params = SamplingParams(max_tokens=12, temperature=0.0)
    expected = [g.token_ids for g in plain.generate(prompts, params)]
    got = [g.token_ids for g in int8.generate(prompts, params)]
    assert all(len(tokens) > 0 for tokens in got)
    # Greedy decoding amplifies any difference once two tokens differ, so
    # compare up to the first difference: wrong kernels would differ at
    # the first token of nearly every prompt.
    same_first = sum(a[0] == b[0] for a, b in zip(expected, got, strict=True))
    prefix = sum(
        next((i for i, (a, b) in enumerate(zip(e, g, strict=False)) if a != b), min(len(e), len(g)))
        for e, g in zip(expected, got, strict=True)
    )
    assert same_first >= len(prompts) - 1
    assert prefix >= 0.3 * sum(len(e) for e in expected)


def test_int8_engine_perplexity_close_to_the_unquantized_one(engines, tokenizer):
    plain, int8 = engines
    text = (
        "The old lighthouse keeper climbed the stairs every evening to light the lamp, and the"
        " ships that passed in the night never knew his name, but they trusted the light."
    )
    ids = tokenizer(text).input_ids
    params = SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=0)

    def nll(engine) -> float:
        entries = engine.generate([ids], params)[0].prompt_logprobs[1:]
        return -sum(entry.logprob for entry in entries) / len(entries)

    # exp(nll) within 5% of the unquantized model's perplexity.
    assert abs(nll(int8) - nll(plain)) < 0.05
