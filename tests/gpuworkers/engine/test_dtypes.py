"""dtype "auto": bfloat16 only where this machine computes in it."""

from __future__ import annotations

import pytest
import torch

from gpuworkers.engine.config import EngineConfig
from gpuworkers.engine.cpu.packing import packing_available
from gpuworkers.engine.dtypes import cpu_has_fast_bfloat16, resolve_dtype


def test_auto_on_cpu_follows_onednn_bfloat16_support():
    expected = "bfloat16" if torch.ops.mkldnn._is_mkldnn_bf16_supported() else "float32"
    assert resolve_dtype("auto", "cpu") == expected
    assert EngineConfig().dtype == expected  # the default is "auto", resolved


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
def test_an_explicit_dtype_is_kept_as_asked(dtype):
    assert resolve_dtype(dtype, "cpu") == dtype
    assert EngineConfig(dtype=dtype).dtype == dtype


def test_an_unknown_dtype_is_refused_by_name():
    with pytest.raises(ValueError, match="unsupported dtype 'int4'"):
        EngineConfig(dtype="int4")


def test_linears_are_packed_for_onednn_only_where_it_has_a_bfloat16_path():
    # On an AVX2-only CPU oneDNN's bfloat16 reorder raises: packing must
    # not be tried there, and a bfloat16 model still loads on plain torch.
    assert packing_available(torch.bfloat16, "cpu") == (
        cpu_has_fast_bfloat16() and torch.backends.mkldnn.is_available()
    )
    assert not packing_available(torch.float32, "cpu")


def test_an_engine_loaded_with_auto_runs_in_the_resolved_dtype(engine):
    # The shared fixture loads with dtype "auto" (tests/plugins/engine.py).
    resolved = resolve_dtype("auto", "cpu")
    assert engine.config.dtype == resolved
    assert engine.runner.kv_cache.dtype == getattr(torch, resolved)
    assert next(engine.runner.model.parameters()).dtype == getattr(torch, resolved)
