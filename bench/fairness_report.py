"""Figures from the driver's records, and the table bench/fairness.py prints."""

from __future__ import annotations

from bench.fairness_load import Phase, Record
from bench.report import _fmt

# Tokens/s of free in buckets this long: the smallest one shows starvation.
BUCKET_S = 5.0


def percentile(values: list[float], q: float) -> float | None:
    """Linear interpolation between closest ranks (numpy's default)."""
    if not values:
        return None
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q
    low = int(pos)
    high = min(low + 1, len(ordered) - 1)
    return round(ordered[low] + (ordered[high] - ordered[low]) * (pos - low), 1)


def _ttfts(records: list[Record], end: float) -> tuple[list[float], int]:
    """TTFTs in ms; a request with no token by ``end`` counts as ``end`` (a lower bound)."""
    values, censored = [], 0
    for record in records:
        ttft = record.ttft_ms()
        if ttft is None:
            censored += 1
            ttft = (end - record.submitted) * 1000
        values.append(ttft)
    return values, censored


def _tokens(phase: Phase, tier: str, start: float, end: float) -> int:
    return sum(n for t, who, n in phase.deltas if who == tier and start <= t < end)


def _counter(beats: list[dict], key: str) -> int | None:
    return beats[-1][key] - beats[0][key] if beats else None


def summarize_phase(idle: Phase, loaded: Phase, marks: dict) -> dict:
    start, end = marks["window_start"], marks["window_end"]
    span = max(end - start, 1e-9)
    idle_ttft, _ = _ttfts(idle.records, marks["start"])
    pro = [r for r in loaded.records if r.tier == "pro"]
    pro_ttft, pro_censored = _ttfts(pro, marks["end"])
    free = [r for r in loaded.records if r.tier == "free" and r.submitted < end]
    free_ttft, free_censored = _ttfts(free, marks["end"])
    buckets = []
    at = start
    while at + BUCKET_S <= end + 1e-6:
        buckets.append(round(_tokens(loaded, "free", at, at + BUCKET_S) / BUCKET_S, 1))
        at += BUCKET_S
    beats = loaded.heartbeats
    window_beats = [b for b in beats if start <= b["t"] <= end]
    usage = [b["kv_used"] / b["kv_total"] for b in window_beats if b["kv_total"]]
    return {
        "idle_pro_ttft_p50_ms": percentile(idle_ttft, 0.5),
        "idle_pro_ttft_p95_ms": percentile(idle_ttft, 0.95),
        "idle_pro_ttft_ms": [round(x, 1) for x in idle_ttft],
        "pro_ttft_p50_ms": percentile(pro_ttft, 0.5),
        "pro_ttft_p95_ms": percentile(pro_ttft, 0.95),
        "pro_ttft_max_ms": percentile(pro_ttft, 1.0),
        "pro_sent": len(pro),
        "pro_completed": sum(r.end_type == "completed" for r in pro),
        "pro_censored": pro_censored,
        "free_ttft_p50_ms": percentile(free_ttft, 0.5),
        "free_ttft_p95_ms": percentile(free_ttft, 0.95),
        "free_sent": len(free),
        "free_completed": sum(r.end_type == "completed" for r in free),
        "free_never_started": free_censored,
        "free_tok_s": round(_tokens(loaded, "free", start, end) / span, 1),
        "free_tok_s_min_5s": min(buckets) if buckets else None,
        "free_tok_s_5s": buckets,
        "pro_tok_s": round(_tokens(loaded, "pro", start, end) / span, 1),
        "preemptions": _counter(beats, "preemptions"),
        "swaps_out": _counter(beats, "swaps_out"),
        "recomputes": _counter(beats, "recomputes"),
        "preemptions_in_window": _counter(window_beats, "preemptions"),
        "kv_usage_mean": round(sum(usage) / len(usage), 3) if usage else None,
        "kv_usage_peak": round(max(usage), 3) if usage else None,
        "ramp_s": round(start - marks["start"], 1),
        "window_s": round(span, 1),
        "grace_used_s": round(marks["end"] - end, 1),
        "heartbeats": [
            {k: (round(v - marks["start"], 2) if k == "t" else v) for k, v in b.items()}
            for b in beats
        ],
    }


ROWS = (
    ("pro TTFT p50 ms (idle worker)", "idle_pro_ttft_p50_ms"),
    ("pro TTFT p95 ms (idle worker)", "idle_pro_ttft_p95_ms"),
    ("pro TTFT p50 ms", "pro_ttft_p50_ms"),
    ("pro TTFT p95 ms", "pro_ttft_p95_ms"),
    ("pro TTFT max ms", "pro_ttft_max_ms"),
    ("pro no token by the end", "pro_censored"),
    ("pro completed / sent", ("pro_completed", "pro_sent")),
    ("free TTFT p50 ms", "free_ttft_p50_ms"),
    ("free TTFT p95 ms", "free_ttft_p95_ms"),
    ("free no token by the end", "free_never_started"),
    ("free tok/s (window)", "free_tok_s"),
    ("free tok/s, worst 5 s", "free_tok_s_min_5s"),
    ("pro tok/s (window)", "pro_tok_s"),
    ("preemptions", "preemptions"),
    ("  swaps out / recomputes", ("swaps_out", "recomputes")),
    ("KV usage mean / peak", ("kv_usage_mean", "kv_usage_peak")),
)


def print_report(summary: dict) -> None:
    shape = summary["shape"]
    policies = summary["policies"]
    print(
        f"\nFairness, {summary['driver']}\n"
        f"{summary['model']} {summary['dtype']}, {summary['threads']} threads, "
        f"KV cache {summary['kv_cache_mb']} MiB, seed {summary['seed']}\n"
        f"free: {shape['free_outstanding']} in flight (closed loop), prompts "
        f"{shape['free_prompt'][0]}..{shape['free_prompt'][1]}, outputs "
        f"{shape['free_out'][0]}..{shape['free_out'][1]} (ignore_eos), priority 0\n"
        f"pro: one every {shape['pro_interval_s']}s for {shape['window_s']:.0f}s, prompts "
        f"{shape['pro_prompt'][0]}..{shape['pro_prompt'][1]}, {shape['pro_out']} tokens, "
        f"priority 1; censored TTFTs count as the time waited (a lower bound)"
    )
    names = [p for p in ("fair", "fcfs") if p in policies]
    print(f"{'':<32}" + "".join(f"{n:>16}" for n in names))
    for label, key in ROWS:
        cells = []
        for name in names:
            result = policies[name]
            if "error" in result:
                cells.append("FAILED")
            elif isinstance(key, tuple):
                cells.append(" / ".join(_fmt(result.get(k), 2) for k in key))
            else:
                cells.append(_fmt(result.get(key)))
        print(f"{label:<32}" + "".join(f"{c:>16}" for c in cells))
    print(
        f"pro p95 fair / idle: {_fmt(summary['ratio_pro_p95_fair_over_idle'], 2)}x (target <= 3)"
        f"   fcfs / fair: {_fmt(summary['ratio_pro_p95_fcfs_over_fair'], 2)}x (target >= 5)"
    )
    print(f"targets met: {summary['targets_met']}")
    for name in names:
        if "error" in policies[name]:
            print(f"{name} failed: {policies[name]['error']}\n{policies[name]['log_tail']}")
    load = summary["machine"]["loadavg_before"][0]
    if load > summary["threads"] * 0.5:
        print(f"warning: load average {load} at the start: other work shared the cores")
