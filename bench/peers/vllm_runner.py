"""vLLM's CPU build as a peer: runs in .peers/vllm-venv, spawned by bench/engine.py
and bench/pairs.py.

    .peers/vllm-venv/bin/python -m bench.peers.vllm_runner --workload W --out R ...
        [--vllm-compiled 1] [--vllm-speculative ngram] [--serve]

Uses vLLM's own ``LLMEngine`` (the loop inside ``LLM.generate``) so that
each token is timed when ``step()`` hands it over, exactly as for this
project's engine. Settings follow shared/PEERS.md: bfloat16, eager mode
unless ``--vllm-compiled 1`` (its default mode: torch.compile, whose
warm-up takes minutes here), ``ngram`` speculation with
``--vllm-speculative ngram``, a 2 GiB KV cache, OpenMP threads bound to
the benchmark's cores, and tcmalloc and Intel OpenMP preloaded as vLLM's
CPU documentation asks (bench/peers/launch.py ``vllm_preload``).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from bench.peers.common import (
    PHASES,
    Sampling,
    StepEvent,
    median_run,
    progress,
    run_multiturn,
    run_offline,
    run_sequential,
    runner_args,
    serve,
    warm_up,
    write_result,
)
from bench.workloads import Workload

PEER = "vllm"
# vLLM's n-gram (prompt lookup) drafter, as shared/PEERS.md runs it.
NGRAM = {
    "method": "ngram",
    "num_speculative_tokens": 4,
    "prompt_lookup_max": 4,
    "prompt_lookup_min": 2,
}


def configure_env(threads: int, kv_cache_gib: float) -> None:
    root = Path(__file__).resolve().parents[2] / ".peers" / "cache"
    os.environ.setdefault("VLLM_CACHE_ROOT", str(root / "vllm"))
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(root / "inductor"))
    # vLLM's default KV space takes most of the machine's memory.
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", f"{kv_cache_gib:g}")
    # The default binding leaves one compute thread on a 2-core machine.
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", f"0-{threads - 1}")
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    # Left unset on purpose: vLLM then runs its scheduler processes on one
    # torch thread and only the bound worker on `threads` OpenMP threads.
    os.environ.pop("OMP_NUM_THREADS", None)


class VllmAdapter:
    """``StepAdapter`` over vLLM's LLMEngine, recording KV-cache usage per step."""

    def __init__(self, engine, sampling_cls, output_kind, tokens_prompt) -> None:
        self.engine = engine
        self.sampling_cls = sampling_cls
        self.output_kind = output_kind
        self.tokens_prompt = tokens_prompt
        self.kv_usage_peak = 0.0
        # Speculative decoding: drafts proposed and accepted (tokens).
        self.spec = {"draft": 0, "accepted": 0}
        self._wrap_get_output()

    def _wrap_get_output(self) -> None:
        # Scheduler stats (KV usage) travel with each engine-core output but
        # LLMEngine.step() does not return them; peek at them on the way.
        core = self.engine.engine_core
        inner = core.get_output

        def get_output():
            outputs = inner()
            stats = getattr(outputs, "scheduler_stats", None)
            if stats is not None:
                self.kv_usage_peak = max(self.kv_usage_peak, float(stats.kv_cache_usage))
                spec = getattr(stats, "spec_decoding_stats", None)
                if spec is not None:
                    self.spec["draft"] += spec.num_draft_tokens
                    self.spec["accepted"] += spec.num_accepted_tokens
            return outputs

        core.get_output = get_output

    def add(
        self, request_id: str, prompt: list[int], max_tokens: int, salt: str, sampling: Sampling
    ) -> None:
        # No per-request seed: on CPU it fails ("CPU Generator does not use
        # offset"); the engine is seeded instead.
        params = self.sampling_cls(
            max_tokens=max_tokens,
            temperature=sampling.temperature,
            top_p=sampling.top_p,
            ignore_eos=True,
            output_kind=self.output_kind,
        )
        self.engine.add_request(
            request_id, self.tokens_prompt(prompt_token_ids=prompt, cache_salt=salt), params
        )

    def step(self) -> list[StepEvent]:
        return [
            StepEvent(
                request_id=out.request_id,
                token_ids=list(out.outputs[0].token_ids),
                finished=out.finished,
                num_cached_tokens=out.num_cached_tokens,
            )
            for out in self.engine.step()
        ]


def kv_figures(adapter: VllmAdapter) -> dict:
    cache = adapter.engine.vllm_config.cache_config
    total = int(cache.num_gpu_blocks or 0)
    used = round(adapter.kv_usage_peak * total)
    return {
        "kv_blocks_used_peak": used,
        "kv_blocks_total": total,
        "block_size": cache.block_size,
        "kv_tokens_used_peak": used * cache.block_size,
    }


def main() -> None:
    args = runner_args(__doc__)
    configure_env(args.threads, args.kv_cache_gib)
    progress(PEER, "importing vllm")
    import vllm
    from vllm import EngineArgs, LLMEngine, SamplingParams, TokensPrompt
    from vllm.sampling_params import RequestOutputKind

    workload = Workload.from_json(args.workload)
    phases = args.phases.split(",")
    eager = not args.vllm_compiled
    speculative = dict(NGRAM) if args.vllm_speculative == "ngram" else None
    mode = ("eager" if eager else "compiled") + ("+ngram" if speculative else "")
    progress(PEER, f"loading {args.model_dir.name} ({args.dtype}, {mode})")
    started = time.perf_counter()
    engine = LLMEngine.from_engine_args(
        EngineArgs(
            model=str(args.model_dir),
            dtype=args.dtype,
            enforce_eager=eager,
            enable_prefix_caching=True,
            speculative_config=speculative,
            # Scheduler stats carry the KV usage figure.
            disable_log_stats=False,
            seed=0,
        )
    )
    load_s = time.perf_counter() - started
    adapter = VllmAdapter(engine, SamplingParams, RequestOutputKind.DELTA, TokensPrompt)
    progress(PEER, f"loaded in {load_s:.1f} s; warm-up")
    warm_up(adapter, workload, salt="load")

    sched = engine.vllm_config.scheduler_config
    compile_config = engine.vllm_config.compilation_config
    result: dict = {
        "peer": PEER,
        "version": vllm.__version__,
        "dtype": args.dtype,
        "threads": args.threads,
        "load_s": round(load_s, 2),
        "mode": mode,
        "settings": {
            "enforce_eager": eager,
            # What "compiled" means on its CPU build: torch.compile traced
            # once with the inductor backend (vllm/platforms/cpu.py).
            "compilation_mode": getattr(compile_config.mode, "name", str(compile_config.mode)),
            "compilation_backend": compile_config.backend,
            "speculative_config": speculative,
            "ld_preload": [p for p in os.environ.get("LD_PRELOAD", "").split(":") if p],
            "tcmalloc": "tcmalloc" in os.environ.get("LD_PRELOAD", ""),
            "intel_openmp": "libiomp" in os.environ.get("LD_PRELOAD", ""),
            "enable_prefix_caching": True,
            "kv_cache_gib": args.kv_cache_gib,
            "max_num_seqs": sched.max_num_seqs,
            "max_num_batched_tokens": sched.max_num_batched_tokens,
        },
    }
    if args.serve:
        serve(result, lambda w, phase, salt: run_round(adapter, w, phase, salt))
        return
    if "offline" in phases:
        runs = []
        for i in range(args.repeat):
            progress(PEER, f"offline run {i + 1}/{args.repeat}: {len(workload.offline)} requests")
            # A fresh cache salt per run: no run reuses an earlier run's prefixes.
            run = run_offline(adapter, workload, salt=f"offline-r{i}")
            progress(PEER, f"offline run {i + 1}: {run['tok_s']} tok/s in {run['elapsed_s']} s")
            runs.append(run)
        result["offline"] = dict(median_run(runs), runs_tok_s=[r["tok_s"] for r in runs])
        result["offline"].update(kv_figures(adapter))
    if "sequential" in phases:
        progress(PEER, f"single stream: {len(workload.offline)} requests one at a time")
        run = run_sequential(adapter, workload, salt="sequential")
        progress(PEER, f"single stream: {run['tok_s']} tok/s, ITL p50 {run['itl']['p50_ms']} ms")
        result["sequential"] = run
    if "multiturn" in phases:
        progress(PEER, f"multi-turn: {len(workload.conversations)} conversations")
        adapter.kv_usage_peak = 0.0
        run = run_multiturn(adapter, workload, salt="multiturn")
        cached = run["prompt_tokens_cached"] or 0
        run["prompt_tokens_computed"] = run["prompt_tokens_sent"] - cached
        run.update(kv_figures(adapter))
        progress(PEER, f"multi-turn: {run['tok_s']} tok/s, TTFT p50 {run['ttft']['p50_ms']} ms")
        result["multiturn"] = run
    write_result(args.out, result)
    progress(PEER, "done")


def run_round(adapter: VllmAdapter, workload: Workload, phase: str, salt: str) -> dict:
    """One timed round of ``bench.pairs`` (``--serve``): warm-up, then ``phase``."""
    warm_up(adapter, workload, salt=salt)
    adapter.kv_usage_peak = 0.0
    before = dict(adapter.spec)
    run = PHASES[phase](adapter, workload, salt=salt)
    run["speculation"] = {k: adapter.spec[k] - before[k] for k in before}
    run.update(kv_figures(adapter))
    progress(PEER, f"{phase} {salt}: {run['tok_s']} tok/s, TPOT p50 {run['tpot']['p50_ms']} ms")
    return run


if __name__ == "__main__":
    # vLLM spawns its engine core as a new process: this guard is required.
    main()
