"""bench.pairs' choices: which vLLM modes a suite tries, which it keeps, and
the spread of the pairs' ratios."""

from __future__ import annotations

import argparse

from bench.pairs import best_mode, parse_args, vllm_candidates
from bench.pairs_report import summarize_suite
from bench.suites import HEADLINE, SUITES


def test_defaults_are_the_headline_suites_over_five_pairs():
    args = parse_args([])
    assert args.suites.split(",") == list(HEADLINE)
    assert args.pairs == 5
    assert args.vllm_mode == "best"
    assert args.out.name == "pairs.json"
    assert parse_args(["--quick"]).out.name == "pairs-quick.json"


def test_ngram_is_tried_where_drafts_can_come_from_the_prompt():
    best = argparse.Namespace(vllm_mode="best")
    assert vllm_candidates(SUITES["decode-heavy"], best) == ["eager", "compiled+ngram", "compiled"]
    assert vllm_candidates(SUITES["copy-edit"], best) == ["eager", "compiled+ngram", "compiled"]
    assert vllm_candidates(SUITES["chat-sampled"], best) == ["eager", "compiled"]
    fixed = argparse.Namespace(vllm_mode="compiled")
    assert vllm_candidates(SUITES["decode-heavy"], fixed) == ["compiled"]


def test_best_mode_keeps_the_fastest_and_skips_failures():
    trials = {
        "eager": {"tok_s": 150.0},
        "compiled": {"tok_s": 170.0},
        "compiled+ngram": {"error": "x"},
    }
    assert best_mode(trials, ["eager", "compiled+ngram", "compiled"]) == "compiled"
    assert best_mode({"eager": {"tok_s": 9.0}}, ["eager", "compiled"]) == "eager"


def run(tok_s: float, ttft: float, tpot: float, draft: int = 0, accepted: int = 0) -> dict:
    return {
        "tok_s": tok_s,
        "elapsed_s": 1.0,
        "output_tokens": 100,
        "prompt_tokens": 100,
        "ttft": {"p50_ms": ttft, "p99_ms": ttft},
        "tpot": {"p50_ms": tpot, "p99_ms": tpot},
        "requests_short_of_max_tokens": 0,
        "speculation": {"draft": draft, "accepted": accepted},
    }


def test_suite_figure_is_the_median_of_per_pair_ratios():
    pairs = [
        {
            "order": ["engine", "engine_nospec", "vllm"],
            "engine": run(300, 100, 10, 10, 5),
            "engine_nospec": run(200, 100, 12),
            "vllm": run(100, 200, 20),
        },
        {
            "order": ["vllm", "engine_nospec", "engine"],
            "engine": run(300, 100, 10, 10, 3),
            "engine_nospec": run(240, 100, 12),
            "vllm": run(200, 200, 20),
        },
        {
            "order": ["engine", "engine_nospec", "vllm"],
            "engine": {"error": "exit 1"},
            "engine_nospec": run(200, 100, 12),
            "vllm": run(100, 200, 20),
        },
    ]
    result = summarize_suite(
        SUITES["chat-sampled"],
        pairs,
        mode="compiled",
        trials={"compiled": run(100, 200, 20)},
        shape={},
        load=(0.1, 0.2),
    )
    # Pairs 1 and 2 only (pair 3 failed): ratios 3.0 and 1.5, not 300/150.
    assert result["ratio_tok_s"] == {"median": 2.25, "min": 1.5, "max": 3.0, "values": [3.0, 1.5]}
    assert result["ratio_tok_s_nospec"]["values"] == [2.0, 1.2]
    assert result["ttft_p50_engine_over_vllm"]["median"] == 0.5
    assert result["speculation"]["engine"] == {"draft": 20, "accepted": 8, "acceptance": 0.4}
    assert result["vllm_mode"] == "compiled"
    assert (result["temperature"], result["top_p"]) == (0.8, 0.95)
    assert result["pairs"][2]["engine"] == {"error": "exit 1"}
