"""Headline figures from the peers' results, and the table printed to stdout."""

from __future__ import annotations

PEER_NAMES = {"engine": "this engine", "vllm": "vLLM-CPU", "hf": "HF static"}
# Issue 2's targets on this machine.
TARGETS = {"ratio_vs_hf": 2.0, "ratio_vs_vllm": 1.0, "multiturn_prefill_fraction": 0.25}


def _get(peers: dict, peer: str, *path):
    value = peers.get(peer)
    for key in path:
        if not isinstance(value, dict):
            return None
        value = value.get(key)
    return value


def _ratio(a, b) -> float | None:
    return round(a / b, 3) if a and b else None


def summarize(peers: dict) -> dict:
    """The flat keys of bench/results/engine.json (None where a peer was skipped)."""
    out: dict = {}
    for peer in ("engine", "hf", "vllm"):
        out[f"{peer}_tok_s"] = _get(peers, peer, "offline", "tok_s")
        for metric in ("ttft", "itl"):
            for q in ("p50", "p99"):
                out[f"{peer}_{metric}_{q}_ms"] = _get(peers, peer, "offline", metric, f"{q}_ms")
        out[f"{peer}_kv_tokens_used_peak"] = _get(peers, peer, "offline", "kv_tokens_used_peak")
        out[f"{peer}_kv_blocks_used_peak"] = _get(peers, peer, "offline", "kv_blocks_used_peak")
    out["ratio_vs_hf"] = _ratio(out["engine_tok_s"], out["hf_tok_s"])
    out["ratio_vs_vllm"] = _ratio(out["engine_tok_s"], out["vllm_tok_s"])

    peak = _get(peers, "peak", "peak_gflops")
    decode = _get(peers, "engine", "offline", "decode", "large_batch_gflops")
    out["peak_gflops"] = peak
    out["decode_gflops"] = decode
    out["decode_peak_fraction"] = _ratio(decode, peak)

    computed = _get(peers, "engine", "multiturn", "prompt_tokens_computed")
    sent = _get(peers, "engine", "multiturn", "prompt_tokens_sent")
    out["multiturn_prefill_computed"] = computed
    out["multiturn_prefill_sent"] = sent
    out["multiturn_prefill_fraction"] = round(computed / sent, 4) if sent else None
    for peer in ("engine", "vllm"):
        out[f"multiturn_{peer}_tok_s"] = _get(peers, peer, "multiturn", "tok_s")
        for q in ("p50", "p99"):
            out[f"multiturn_{peer}_ttft_{q}_ms"] = _get(peers, peer, "multiturn", "ttft", f"{q}_ms")
    out["multiturn_vllm_prefill_computed"] = _get(
        peers, "vllm", "multiturn", "prompt_tokens_computed"
    )

    met = {}
    for key, target in TARGETS.items():
        value = out.get(key)
        if value is not None:
            met[key] = value < target if key.endswith("fraction") else value >= target
    out["targets_met"] = met
    out["failed_peers"] = sorted(p for p, r in peers.items() if "error" in r)
    return out


def _fmt(value, digits: int = 1) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def _pair(a, b) -> str:
    return f"{_fmt(a)} / {_fmt(b)}"


def print_report(summary: dict) -> None:
    peers = summary["peers"]
    shape = summary["workload"]["shape"]
    print(
        f"\nOffline: {shape['num_requests']} requests, prompts {shape['prompt_min']}.."
        f"{shape['prompt_max']}, outputs {shape['out_min']}..{shape['out_max']} (ignore_eos), "
        f"{summary['dtype']}, {summary['threads']} threads, median of {summary['repeat']} runs"
        f" ({summary['hf_repeat']} for HF)"
    )
    header = f"{'peer':<12}{'out tok/s':>10}  {'runs':<22}{'TTFT p50 / p99 ms':>22}"
    print(header + f"{'ITL p50 / p99 ms':>20}{'KV tokens peak':>16}")
    for peer in ("engine", "vllm", "hf"):
        if peer not in peers:
            continue
        if "error" in peers[peer]:
            print(f"{PEER_NAMES[peer]:<12}  FAILED ({peers[peer]['error']}; see the log above)")
            continue
        runs = ", ".join(_fmt(x) for x in _get(peers, peer, "offline", "runs_tok_s") or [])
        print(
            f"{PEER_NAMES[peer]:<12}{_fmt(summary[f'{peer}_tok_s']):>10}  {runs:<22}"
            f"{_pair(summary[f'{peer}_ttft_p50_ms'], summary[f'{peer}_ttft_p99_ms']):>22}"
            f"{_pair(summary[f'{peer}_itl_p50_ms'], summary[f'{peer}_itl_p99_ms']):>20}"
            f"{_fmt(summary[f'{peer}_kv_tokens_used_peak']):>16}"
        )
    print(
        f"engine / HF: {_fmt(summary['ratio_vs_hf'], 2)}x   "
        f"engine / vLLM: {_fmt(summary['ratio_vs_vllm'], 2)}x"
    )
    decode = _get(peers, "engine", "offline", "decode") or {}
    print(
        f"decode: {_fmt(summary['decode_gflops'])} GFLOP/s over steps of >= "
        f"{_fmt(decode.get('large_batch_threshold'))} sequences = "
        f"{_fmt(summary['decode_peak_fraction'], 3)} of the measured bf16 linear peak "
        f"({_fmt(summary['peak_gflops'])} GFLOP/s)"
    )
    print(
        f"\nMulti-turn: {shape['conversations']} conversations x {shape['turns']} turns, "
        f"{shape['system_tokens']}-token system prompt, +{shape['user_tokens']} user / "
        f"{shape['turn_max_tokens']} generated per turn"
    )
    print(f"{'peer':<12}{'out tok/s':>10}{'TTFT p50 / p99 ms':>22}{'prefill computed / sent':>28}")
    for peer in ("engine", "vllm"):
        run = _get(peers, peer, "multiturn")
        if not run:
            continue
        print(
            f"{PEER_NAMES[peer]:<12}{_fmt(run['tok_s']):>10}"
            f"{_pair(run['ttft']['p50_ms'], run['ttft']['p99_ms']):>22}"
            f"{_fmt(run.get('prompt_tokens_computed')) + ' / ' + _fmt(run['prompt_tokens_sent']):>28}"
        )
    print(f"targets met: {summary['targets_met']}")
    load = summary["machine"]["loadavg_before"][0]
    if load > summary["threads"] * 0.5:
        print(f"warning: load average {load} at the start: other work shared the cores")
