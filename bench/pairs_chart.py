"""bench.pairs' ratios as a chart: ``python -m bench.pairs_chart``.

    python -m bench.pairs_chart [--pairs bench/results/pairs.json]
                                [--out docs/img/pairs.svg]

One row per suite: for each engine arm (speculation on, and off) a bar to
the median ratio of output tok/s against vLLM at its best, a whisker from
the lowest pair's ratio to the highest, and the figure; a line at 1x
(vLLM) and one at each suite's goal where the issue set one. Plain SVG
written by hand (no plotting library is a dependency), so the README and
docs show it as an image.
"""

from __future__ import annotations

import argparse
import json
from html import escape
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# Issue 33's goals (engine with its defaults over vLLM at its best).
GOALS = {
    "chat-sampled": 2.5,
    "single-stream-sampled": 2.5,
    "decode-heavy": 2.0,
    "prefill-heavy": 1.5,
}
ARMS = (
    ("ratio_tok_s", "engine, speculation on (its default)", "#2f6db5"),
    ("ratio_tok_s_nospec", "engine, speculation off", "#8fb3de"),
)
LABEL_WIDTH, PLOT_WIDTH, BAR, GAP, TOP = 190, 460, 14, 14, 58


def render(summary: dict) -> str:
    """The SVG text for a pairs.json summary."""
    suites = [(n, s) for n, s in summary["suites"].items() if "ratio_tok_s" in s]
    if not suites:
        raise ValueError("no suite in this summary has ratios")
    top = max(s[key]["max"] for _, s in suites for key, _, _ in ARMS)
    scale_max = max(3.0, float(int(top) + 1))
    x_of = lambda ratio: LABEL_WIDTH + PLOT_WIDTH * ratio / scale_max  # noqa: E731
    row = 2 * BAR + GAP
    height = TOP + row * len(suites) + 46
    width = LABEL_WIDTH + PLOT_WIDTH + 70
    machine = summary.get("machine", {})
    title = (
        f"Output tok/s against vLLM-CPU at its best: median of {summary['pairs']} pairs,"
        " whiskers min..max"
    )
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}"'
        f' font-family="sans-serif" font-size="12">',
        f'<rect width="{width}" height="{height}" fill="white"/>',
        f'<text x="10" y="18" font-size="13" font-weight="bold">{escape(title)}</text>',
        f'<text x="10" y="36" fill="#555">{escape(_subtitle(summary, machine))}</text>',
    ]
    for tick in range(int(scale_max) + 1):
        x = x_of(tick)
        color = "#222" if tick == 1 else "#ddd"
        parts.append(
            f'<line x1="{x:.1f}" y1="{TOP - 6}" x2="{x:.1f}" y2="{height - 40}" stroke="{color}"/>'
        )
        parts.append(f'<text x="{x:.1f}" y="{height - 26}" text-anchor="middle">{tick}x</text>')
    for i, (name, suite) in enumerate(suites):
        y = TOP + i * row
        mode = suite.get("vllm_mode", "")
        parts.append(f'<text x="10" y="{y + BAR + 4}">{escape(name)}</text>')
        parts.append(
            f'<text x="10" y="{y + BAR + 17}" fill="#777" font-size="10">vLLM {escape(mode)}</text>'
        )
        if name in GOALS:
            x = x_of(GOALS[name])
            parts.append(
                f'<line x1="{x:.1f}" y1="{y - 2}" x2="{x:.1f}" y2="{y + 2 * BAR + 2}"'
                ' stroke="#c0392b" stroke-dasharray="3,2"/>'
            )
        for j, (key, _, color) in enumerate(ARMS):
            s = suite[key]
            top_y = y + j * BAR
            mid = top_y + BAR / 2
            parts.append(
                f'<rect x="{LABEL_WIDTH}" y="{top_y + 1}" width="{x_of(s["median"]) - LABEL_WIDTH:.1f}"'
                f' height="{BAR - 2}" fill="{color}"/>'
            )
            parts.append(
                f'<line x1="{x_of(s["min"]):.1f}" y1="{mid}" x2="{x_of(s["max"]):.1f}" y2="{mid}"'
                ' stroke="#111" stroke-width="1.5"/>'
            )
            label_x = max(x_of(s["max"]), x_of(s["median"])) + 5
            parts.append(
                f'<text x="{label_x:.1f}" y="{mid + 4}" font-size="11">{s["median"]:.2f}x</text>'
            )
    legend_y = height - 10
    x = 10
    for _, label, color in ARMS:
        parts.append(f'<rect x="{x}" y="{legend_y - 10}" width="12" height="10" fill="{color}"/>')
        parts.append(f'<text x="{x + 16}" y="{legend_y}">{escape(label)}</text>')
        x += 16 + 7 * len(label) + 20
    parts.append(
        f'<line x1="{x}" y1="{legend_y - 5}" x2="{x + 14}" y2="{legend_y - 5}"'
        ' stroke="#c0392b" stroke-dasharray="3,2"/>'
    )
    parts.append(f'<text x="{x + 18}" y="{legend_y}">goal (issue 33)</text>')
    parts.append("</svg>")
    return "\n".join(parts) + "\n"


def _subtitle(summary: dict, machine: dict) -> str:
    cpu = machine.get("cpu", "?")
    started = str(summary.get("timestamp", ""))[:16].replace("T", " ")
    return (
        f"{cpu}, {summary.get('threads', '?')} threads, {started} UTC;"
        " python -m bench.pairs (bench/results/pairs.json)"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=Path, default=ROOT / "bench" / "results" / "pairs.json")
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "img" / "pairs.svg")
    args = parser.parse_args(argv)
    svg = render(json.loads(args.pairs.read_text()))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(svg)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
