"""bench.quant's options: the single-stream figure is a median of several."""

from __future__ import annotations

import pytest

from bench.quant import parse_args, render


def test_single_streams_default_to_five_and_refuse_none():
    assert parse_args([]).single_repeat == 5
    assert parse_args(["--single-repeat", "1"]).single_repeat == 1
    with pytest.raises(SystemExit):
        parse_args(["--single-repeat", "0"])


def test_the_table_says_how_many_streams_its_single_stream_median_is_of():
    report = {
        "command": "python -m bench.quant",
        "date": "2026-12-04 18:47 UTC",
        "machine": {"cpu": "AMD EPYC", "nproc": 2, "loadavg_before": [0.9], "loadavg_after": [1.7]},
        "threads": 2,
        "model": "smollm2-135m-instruct",
        "dtype": "bfloat16",
        "workload": {
            "prompts": 24,
            "max_tokens": 48,
            "repeat": 2,
            "perplexity_passages": 12,
            "perplexity_text": "bench/data/edit_passages_austen.txt",
            "single_stream_tokens": 128,
            "single_stream_repeat": 5,
        },
        "arms": [],
        "llamacpp": [],
    }
    assert "median of 5 alternating streams" in render(report)
