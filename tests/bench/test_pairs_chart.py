"""bench.pairs_chart: the bars, whiskers and goals it draws from pairs.json."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET

import pytest

from bench.pairs_chart import main, render


def spread(median: float, low: float, high: float) -> dict:
    return {"median": median, "min": low, "max": high, "values": [low, median, high]}


def summary() -> dict:
    return {
        "timestamp": "2026-12-04T17:34:37Z",
        "pairs": 5,
        "threads": 2,
        "machine": {"cpu": "AMD EPYC"},
        "suites": {
            "chat-sampled": {
                "vllm_mode": "compiled",
                "ratio_tok_s": spread(2.1, 1.9, 2.4),
                "ratio_tok_s_nospec": spread(1.8, 1.7, 2.0),
            },
            "copy-edit": {
                "vllm_mode": "eager",
                "ratio_tok_s": spread(3.6, 3.1, 4.2),
                "ratio_tok_s_nospec": spread(1.2, 1.1, 1.3),
            },
            # A suite whose pairs all failed has no ratios: left out.
            "decode-heavy": {"vllm_mode": "compiled"},
        },
    }


def texts(svg: str) -> list[str]:
    root = ET.fromstring(svg)
    return [t.text for t in root.iter("{http://www.w3.org/2000/svg}text")]


def test_one_row_per_suite_with_ratios_and_each_arms_median():
    svg = render(summary())
    labels = texts(svg)
    assert "chat-sampled" in labels and "copy-edit" in labels
    assert "decode-heavy" not in labels
    for median in ("2.10x", "1.80x", "3.60x", "1.20x"):
        assert median in labels
    # The axis reaches past the largest whisker (4.2x): ticks up to 5x.
    assert "5x" in labels and "6x" not in labels
    assert "vLLM compiled" in labels and "vLLM eager" in labels


def test_goal_lines_only_for_suites_with_a_goal():
    root = ET.fromstring(render(summary()))
    dashed = [
        line
        for line in root.iter("{http://www.w3.org/2000/svg}line")
        if line.get("stroke-dasharray") and line.get("y1") != line.get("y2")
    ]
    # chat-sampled has a goal (2.5x), copy-edit none.
    assert len(dashed) == 1


def test_a_summary_without_ratios_is_refused(tmp_path):
    empty = {**summary(), "suites": {"decode-heavy": {"vllm_mode": "compiled"}}}
    with pytest.raises(ValueError, match="no suite"):
        render(empty)
    source, out = tmp_path / "pairs.json", tmp_path / "img" / "pairs.svg"
    source.write_text(json.dumps(summary()))
    assert main(["--pairs", str(source), "--out", str(out)]) == 0
    assert out.read_text().startswith("<svg")
