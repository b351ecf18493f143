"""bench.pairs' per-suite summary (the JSON) and the table it prints."""

from __future__ import annotations

import statistics

from bench.suites import Suite

ARMS = ("engine", "engine_nospec", "vllm")


def figures(run: dict) -> dict:
    """The numbers of one run that the summary keeps, or its error."""
    if "error" in run:
        return {"error": run["error"]}
    out = {
        "tok_s": run["tok_s"],
        "elapsed_s": run["elapsed_s"],
        "output_tokens": run["output_tokens"],
        "prompt_tokens": run["prompt_tokens"],
        "ttft_p50_ms": run["ttft"]["p50_ms"],
        "ttft_p99_ms": run["ttft"]["p99_ms"],
        # TPOT, not ITL: a step that returns several tokens of one request
        # gives ITL gaps of 0.
        "tpot_p50_ms": run["tpot"]["p50_ms"],
        "tpot_p99_ms": run["tpot"]["p99_ms"],
        "short_requests": run["requests_short_of_max_tokens"],
    }
    if run.get("speculation"):
        out["speculation"] = run["speculation"]
    if run.get("preemptions"):
        out["preemptions"] = run["preemptions"]
    return out


def spread(values: list[float]) -> dict:
    return {
        "median": round(statistics.median(values), 3),
        "min": round(min(values), 3),
        "max": round(max(values), 3),
        "values": [round(v, 3) for v in values],
    }


def _speculation(pairs: list[dict], arm: str) -> dict | None:
    runs = [p[arm]["speculation"] for p in pairs if "speculation" in p.get(arm, {})]
    if not runs:
        return None
    draft = sum(r["draft"] for r in runs)
    accepted = sum(r["accepted"] for r in runs)
    return {
        "draft": draft,
        "accepted": accepted,
        "acceptance": round(accepted / draft, 3) if draft else None,
    }


def summarize_suite(
    suite: Suite,
    pairs: list[dict],
    *,
    mode: str,
    trials: dict[str, dict],
    shape: dict,
    load: tuple[float, float],
) -> dict:
    """One suite's entry in pairs.json: every run, and the ratios' spread."""
    pairs = [{k: v if k == "order" else figures(v) for k, v in p.items()} for p in pairs]
    result: dict = {
        "phase": suite.phase,
        "prompts": suite.prompts,
        "temperature": suite.sampling[0],
        "top_p": suite.sampling[1],
        "workload": shape,
        "vllm_mode": mode,
        "vllm_mode_trial": {m: figures(r) for m, r in trials.items()} or None,
        "pairs": pairs,
        "loadavg_1m_before": round(load[0], 2),
        "loadavg_1m_after": round(load[1], 2),
    }
    ok = [p for p in pairs if all(p[arm].get("tok_s") for arm in ARMS)]
    if not ok:
        return result
    result["ratio_tok_s"] = spread([p["engine"]["tok_s"] / p["vllm"]["tok_s"] for p in ok])
    result["ratio_tok_s_nospec"] = spread(
        [p["engine_nospec"]["tok_s"] / p["vllm"]["tok_s"] for p in ok]
    )
    for key in ("tok_s", "ttft_p50_ms", "tpot_p50_ms"):
        result[key] = {arm: spread([p[arm][key] for p in ok]) for arm in ARMS}
    # Below 1: the engine's first token came sooner than vLLM's.
    result["ttft_p50_engine_over_vllm"] = spread(
        [p["engine"]["ttft_p50_ms"] / p["vllm"]["ttft_p50_ms"] for p in ok]
    )
    result["speculation"] = {arm: _speculation(ok, arm) for arm in ("engine", "vllm")}
    return result


def _range(s: dict) -> str:
    return f"{s['median']:.2f}x [{s['min']:.2f}..{s['max']:.2f}]"


def print_table(summary: dict) -> None:
    print(
        f"{'suite':<22}{'vLLM mode':<16}{'engine':>8}{'no-spec':>9}{'vLLM':>8}"
        f"{'ratio [min..max]':>24}{'no-spec ratio':>24}{'TTFT p50 e/v ms':>18}"
        f"{'TPOT p50 e/ns/v ms':>21}{'accepted':>14}{'load':>11}"
    )
    for name, suite in summary["suites"].items():
        if "ratio_tok_s" not in suite:
            print(f"{name:<22}{suite['vllm_mode']:<16}  failed: see pairs in the JSON")
            continue
        tok, ttft, tpot = suite["tok_s"], suite["ttft_p50_ms"], suite["tpot_p50_ms"]
        spec = suite["speculation"]["engine"] or {}
        accepted = f"{spec.get('accepted', 0)}/{spec.get('draft', 0)}"
        tpot_text = "/".join(f"{tpot[arm]['median']:.1f}" for arm in ARMS)
        print(
            f"{name:<22}{suite['vllm_mode']:<16}"
            + "".join(f"{tok[a]['median']:>{w}.1f}" for a, w in zip(ARMS, (8, 9, 8), strict=True))
            + f"{_range(suite['ratio_tok_s']):>24}{_range(suite['ratio_tok_s_nospec']):>24}"
            + f"{ttft['engine']['median']:>9.0f}/{ttft['vllm']['median']:<8.0f}"
            + f"{tpot_text:>21}"
            + f"{accepted:>14}"
            + f"{suite['loadavg_1m_before']:>5.1f}->{suite['loadavg_1m_after']:.1f}"
        )
    print("\nvLLM mode trials (output tok/s, one round each):")
    for name, suite in summary["suites"].items():
        trials = suite.get("vllm_mode_trial") or {}
        text = ", ".join(
            f"{mode} {run['tok_s']:.1f}" if "tok_s" in run else f"{mode} failed"
            for mode, run in trials.items()
        )
        print(f"  {name:<22}{text or '(not tried: --vllm-mode given)'}")
    machine = summary["machine"]
    print(
        f"\n{summary['pairs']} pairs per suite, {summary['threads']} threads, "
        f"{machine['cpu']}; vLLM preloads {summary['vllm_preload'] or 'nothing'}; "
        f"load {machine['loadavg_before'][0]} -> {machine['loadavg_after'][0]}"
    )
    if machine["loadavg_before"][0] > summary["threads"] * 0.5:
        print("warning: the machine was busy at the start: the figures are noise")
