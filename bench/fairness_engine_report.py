"""Fair shares, Jain's index and the table of bench/fairness_engine.py."""

from __future__ import annotations

from bench.report import _fmt


def fair_shares(tokens: dict[str, int], demands: dict[str, int]) -> dict[str, float]:
    """Max-min fair shares of the generated tokens: a tenant with a known
    demand (``demands``, in tokens) gets at most that; the rest share what
    is left equally (water-filling). Tenants are those of both maps."""
    total = sum(tokens.values()) or 1
    tenants = set(tokens) | set(demands)
    caps = {t: demands[t] / total for t in demands}
    shares: dict[str, float] = {}
    left, open_ = 1.0, set(tenants)
    while open_:
        equal = left / len(open_)
        capped = {t for t in open_ if t in caps and caps[t] <= equal}
        if not capped:
            shares.update(dict.fromkeys(open_, equal))
            break
        for tenant in capped:
            shares[tenant] = caps[tenant]
            left -= caps[tenant]
        open_ -= capped
    return shares


def jain(values: dict[str, float]) -> float | None:
    """Jain's fairness index of ``values`` (1.0: all equal; 1/n: one has all)."""
    xs = list(values.values())
    if not xs or not any(xs):
        return None
    return round(sum(xs) ** 2 / (len(xs) * sum(x * x for x in xs)), 4)


ROWS = (
    ("light served / sent", ("light_served", "light_sent")),
    ("light TTFT p50 / p95 (steps)", ("light_ttft_p50_steps", "light_ttft_p95_steps")),
    ("light TTFT max (steps)", "light_ttft_max_steps"),
    ("light TTFT p50 / p95 (ms)", ("light_ttft_p50_ms", "light_ttft_p95_ms")),
    ("light p95 / idle p95 (steps)", "ratio_steps"),
    ("light p95 / idle p95 (ms)", "ratio_ms"),
    ("Jain's index (share/fair)", "jain"),
    ("preemptions (swaps/recomputes)", ("preemptions", "swaps_out", "recomputes")),
    ("wall s", "wall_s"),
)


def print_report(summary: dict) -> None:
    args, idle, policies = summary["args"], summary["idle"], summary["policies"]
    names = list(policies)
    for result in policies.values():
        result["ratio_steps"] = _ratio(result["light_ttft_p95_steps"], idle["ttft_p95_steps"])
        result["ratio_ms"] = _ratio(result["light_ttft_p95_ms"], idle["ttft_p95_ms"])
    print(
        f"\nEngine fairness, {summary['scenario']}, model {summary['model']}: "
        f"{args['flooders']} pro flooders x {args['depth']} in flight, prompts "
        f"{args['flood_prompt']} + {args['flood_output']} out; KV {args['kv_blocks']} blocks "
        f"of 16, budget {args['max_batched_tokens']}, {args['max_num_seqs']} seqs\n"
        f"light ({'enterprise' if summary['scenario'] == 'across-tiers' else 'pro'}): "
        f"{args['light_prompt']} + {args['light_output']} every {args['light_every']} steps; "
        f"{args['steps']} steps, shares after step {args['ramp']}\n"
        f"idle light TTFT p50 / p95: {_fmt(idle['ttft_p50_steps'])} / "
        f"{_fmt(idle['ttft_p95_steps'])} steps, {_fmt(idle['ttft_p50_ms'])} / "
        f"{_fmt(idle['ttft_p95_ms'])} ms"
    )
    print(f"{'':<32}" + "".join(f"{n:>18}" for n in names))
    for label, key in ROWS:
        cells = []
        for name in names:
            result = policies[name]
            if isinstance(key, tuple):
                cells.append(" / ".join(_fmt(result.get(k)) for k in key))
            else:
                cells.append(_fmt(result.get(key), 2))
        print(f"{label:<32}" + "".join(f"{c:>18}" for c in cells))
    tenants = sorted({t for r in policies.values() for t in r["share"]})
    print("share of generated tokens (fair share)")
    for tenant in tenants:
        cells = [
            f"{_fmt(r['share'].get(tenant, 0.0), 3)} ({_fmt(r['fair_share'].get(tenant), 3)})"
            for r in policies.values()
        ]
        print(f"  {tenant:<30}" + "".join(f"{c:>18}" for c in cells))
    load = summary["machine"]["loadavg_before"][0]
    if load > args["threads"] * 0.5:
        print(f"warning: load average {load} at the start: the ms figures are noisy")


def _ratio(value, base):
    return round(value / base, 2) if value is not None and base else None
