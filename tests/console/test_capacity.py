"""The KV capacity calculator against the design documents' worked example."""

import pytest

from console.capacity import GIB, ModelShape, capacity, kv_bytes_per_token, shape_from_config
from console.selectors import model_shape_from_dir

SEVENTY_B = ModelShape(layers=80, kv_heads=8, head_dim=128, params_billion=70, context_length=8192)


def test_worked_example_bytes_per_token_and_reservation():
    """70B, 80 layers, 8 KV heads of 128 at FP16: 327,680 B/token, 2.5 GiB per 8K."""
    assert kv_bytes_per_token(layers=80, kv_heads=8, head_dim=128, dtype_bytes=2) == 327_680
    report = capacity(shape=SEVENTY_B, gpu_memory_gib=80)
    assert report.kv_bytes_per_token == 327_680
    assert report.reservation_bytes == 327_680 * 8192
    assert report.reservation_gib == 2.5


def test_weight_precision_sets_the_number_of_reservations():
    """80 GiB: FP16 weights (130 GiB) do not fit; FP8 and INT4 leave room for 5 and 18."""
    rows = {r.precision: r for r in capacity(shape=SEVENTY_B, gpu_memory_gib=80).rows}
    assert rows["FP16"].concurrent_reservations == 0 and rows["FP16"].kv_budget_gib < 0
    fp8_budget = 80 - 70e9 / GIB
    assert rows["FP8"].concurrent_reservations == int(fp8_budget // 2.5) == 5
    assert rows["INT4"].concurrent_reservations == int((80 - 35e9 / GIB) // 2.5) == 18
    assert rows["INT4"].tokens_in_flight == 18 * 8192


def test_fp8_kv_and_runtime_reserve():
    """An FP8 KV cache halves the reservation; the runtime reserve comes off the budget."""
    report = capacity(shape=SEVENTY_B, gpu_memory_gib=141, kv_dtype_bytes=1, runtime_reserve_gib=10)
    assert report.reservation_gib == 1.25
    fp8 = next(r for r in report.rows if r.precision == "FP8")
    assert fp8.concurrent_reservations == int((141 - 10 - 70e9 / GIB) // 1.25)


def test_shape_from_config_defaults_kv_heads_and_head_dim():
    """No num_key_value_heads: multi-head attention; head_dim from hidden_size."""
    shape = shape_from_config(
        {"num_hidden_layers": 12, "num_attention_heads": 12, "hidden_size": 768},
        params_billion=0.1,
    )
    assert (shape.kv_heads, shape.head_dim, shape.context_length) == (12, 64, 2048)


def test_invalid_shape_is_refused():
    with pytest.raises(ValueError, match="layers"):
        ModelShape(layers=0, kv_heads=1, head_dim=1, params_billion=1, context_length=1)


def test_demo_model_shape_from_its_files():
    """The served demo model's config.json and weights: SmolLM2-135M's GQA shape."""
    from gpuworkers.engine.convert_gguf import ensure_demo_model

    shape = model_shape_from_dir(ensure_demo_model())
    assert (shape.layers, shape.kv_heads, shape.head_dim) == (30, 3, 64)
    assert 0.1 < shape.params_billion < 0.2
    assert kv_bytes_per_token(layers=30, kv_heads=3, head_dim=64, dtype_bytes=2) == 23_040
