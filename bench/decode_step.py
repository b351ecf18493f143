"""Time one engine decode step and its parts: ``python -m bench.decode_step``.

Fills the engine with ``--batch`` requests (prompts uniform in 16..1024
tokens, as in bench.engine's offline workload, or to ``--max-prompt``; one
request by default),
prefills them all, then times pure decode steps of all of them, greedy,
speculation off. Prints:

- the step's wall and CPU time (the CPU time is the process's, all its
  threads: on a shared machine it says what the step cost, where the wall
  time also says who else ran), split into the model's forward pass,
  sampling, the runner's input building, and the rest of the engine step
  around them (scheduler, stop checks, detokenizer, outputs);
- the weight-streaming limit: the bytes of weights a decode step reads
  (every linear's weight, the norms; not the embedding table, of which a
  step reads one row per token) over the bandwidth of a plain streaming
  read on ``--threads`` threads (a sum over a 1 GiB float32 tensor, the
  best of several), and the step's ratio to it;
- a per-kernel profile of the forward pass from a few extra steps run
  through the Python layer loop with timers around each kind of call
  (linears, attention, the fused element-wise ops), the rest being Python
  and torch ops around them; these steps are slower than the timed ones
  (the timers and the loop cost time), the profile's shares are what it is
  for.

Compares with plain torch (``--no-fast-paths``) or the Python layer loop
(``--no-decode-layers``, engine/cpu/decode_layers.py). Prints, asserts
nothing; ``--output`` appends the command and its report to a file.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time
from collections import defaultdict

import torch

from gpuworkers.engine import LLMEngine, SamplingParams
from gpuworkers.engine import model_runner as runner_module
from gpuworkers.engine.convert_gguf import ensure_demo_model
from gpuworkers.engine.cpu.decode_layers import ENV_SWITCH as DECODE_LAYERS_SWITCH

STREAM_BYTES = 256 << 20


def stream_bandwidth(threads: int, repeats: int = 30) -> tuple[float, float]:
    """Bytes per second of a streaming read (``Tensor.sum`` over 256 MiB of
    float32, which is memory-bound), the best of ``repeats``: by wall time,
    and by CPU time per thread (on a shared machine the wall time counts
    the time other processes held the cores; the CPU time does not)."""
    torch.set_num_threads(threads)
    data = torch.ones(STREAM_BYTES // 4, dtype=torch.float32)
    data.sum()  # fault the pages in before timing
    wall = cpu = float("inf")
    for _ in range(repeats):
        started, started_cpu = time.perf_counter(), time.process_time()
        data.sum()
        wall = min(wall, time.perf_counter() - started)
        cpu = min(cpu, (time.process_time() - started_cpu) / threads)
    return STREAM_BYTES / wall, STREAM_BYTES / cpu


def decode_weight_bytes(model: torch.nn.Module) -> int:
    """Bytes of the weights one decode step reads: every linear's weight
    (packed or not) and bias, and the norms. The embedding is one row per
    token; a tied LM head's weight is counted once, as the LM head's."""
    seen: set[int] = set()
    total = 0
    for name, module in model.named_modules():
        tensors = []
        if hasattr(module, "packed_weight"):
            # An int8 linear's packed weight is one byte a weight, plus its scales.
            tensors = [module.packed_weight, getattr(module, "bias", None)]
            tensors.append(getattr(module, "scales", None))
        elif hasattr(module, "quantized"):  # torch's weight-only int8 linear
            tensors = [module.quantized, module.scales, module.bias]
        elif isinstance(module, torch.nn.Linear):
            tensors = [module.weight, module.bias]
        elif name.endswith("norm"):
            tensors = [module.weight]
        for t in tensors:
            if t is not None and t.data_ptr() not in seen:
                seen.add(t.data_ptr())
                total += t.numel() * t.element_size()
    return total


class Timers:
    """Wall and CPU seconds (all threads) per label, from wrappers around callables."""

    def __init__(self):
        self.seconds: dict[str, float] = defaultdict(float)
        self.cpu: dict[str, float] = defaultdict(float)

    def wrap(self, fn, label: str):
        def timed(*args, **kwargs):
            started, started_cpu = time.perf_counter(), time.process_time()
            try:
                return fn(*args, **kwargs)
            finally:
                self.seconds[label] += time.perf_counter() - started
                self.cpu[label] += time.process_time() - started_cpu

        return timed

    def reset(self) -> None:
        self.seconds.clear()
        self.cpu.clear()


def time_steps(engine: LLMEngine, steps: int, timers: Timers) -> tuple[float, float, float]:
    """Mean wall, fastest wall and mean CPU seconds per step over
    ``steps`` decode steps."""
    timers.reset()
    walls = []
    cpu = time.process_time()
    for _ in range(steps):
        started = time.perf_counter()
        engine.step()
        walls.append(time.perf_counter() - started)
    return sum(walls) / steps, min(walls), (time.process_time() - cpu) / steps


def kernel_profile(engine: LLMEngine, steps: int) -> Timers:
    """Wall and CPU seconds in linears, attention, the fused element-wise
    ops and the whole forward (label "forward") over ``steps`` steps run
    through the Python layer loop."""
    model = engine.runner.model
    timers = Timers()
    saved_layers, model.decode_layers = model.decode_layers, None
    patched: list[tuple[object, str]] = []

    def patch(owner, attr: str, label: str) -> None:
        setattr(owner, attr, timers.wrap(getattr(owner, attr), label))
        patched.append((owner, attr))

    for module in model.modules():
        if hasattr(module, "packed_weight") or isinstance(module, torch.nn.Linear):
            patch(module, "forward", "linears")
    patch(engine.runner.backend, "forward", "attention")
    fused = next((m.fused for m in model.modules() if getattr(m, "fused", None)), None)
    if fused is not None:
        for attr in ("rms_norm", "rotary_", "silu_and_mul"):
            patch(fused, attr, "norms, rotary, silu")
    patch(model, "forward", "forward")
    try:
        for _ in range(steps):
            engine.step()
    finally:
        for owner, attr in patched:
            delattr(owner, attr)
        model.decode_layers = saved_layers
    return timers


def interleaved(engine: LLMEngine, blocks: int, block: int = 5) -> dict[str, tuple[float, float]]:
    """Wall and CPU seconds per step of the compiled and the Python layer
    loop, alternating blocks of ``block`` steps: a ratio that a shared
    machine's changing load skews less than two separate runs."""
    model = engine.runner.model
    saved = model.decode_layers
    totals = {"compiled layer loop": [0.0, 0.0], "Python layer loop": [0.0, 0.0]}
    try:
        for _ in range(blocks):
            for name, layers in zip(totals, (saved, None), strict=True):
                model.decode_layers = layers
                wall, cpu = time.perf_counter(), time.process_time()
                for _ in range(block):
                    engine.step()
                totals[name][0] += time.perf_counter() - wall
                totals[name][1] += time.process_time() - cpu
    finally:
        model.decode_layers = saved
    return {name: (w / (blocks * block), c / (blocks * block)) for name, (w, c) in totals.items()}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=1, help="sequences decoding together")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--budget", type=int, default=512, help="max_num_batched_tokens")
    parser.add_argument("--max-prompt", type=int, default=1024, help="longest prompt (tokens)")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--profile-steps", type=int, default=5)
    parser.add_argument(
        "--ab-blocks",
        type=int,
        default=3,
        help="blocks of 5 steps each of the compiled and the Python layer loop, alternating",
    )
    parser.add_argument(
        "--no-fast-paths",
        action="store_true",
        help="plain torch: no CPU kernels, no packed linears (EngineConfig.cpu_fast_paths)",
    )
    parser.add_argument(
        "--kv-cache-dtype", default="auto", choices=["auto", "int8"], help="EngineConfig field"
    )
    parser.add_argument(
        "--quantization",
        choices=["int8"],
        help="weight-only int8 linears (EngineConfig.quantization; default: none)",
    )
    parser.add_argument(
        "--no-decode-layers",
        action="store_true",
        help=f"the Python layer loop instead of the compiled one ({DECODE_LAYERS_SWITCH}=0)",
    )
    parser.add_argument("--output", help="append the command and this report to this file")
    args = parser.parse_args(argv)
    if args.no_decode_layers:
        os.environ[DECODE_LAYERS_SWITCH] = "0"
    lines: list[str] = []

    def report(line: str = "") -> None:
        print(line, flush=True)
        lines.append(line)

    engine = LLMEngine.from_pretrained(
        ensure_demo_model(),
        dtype=args.dtype,
        kv_cache_dtype=args.kv_cache_dtype,
        quantization=args.quantization,
        kv_cache_bytes=2 << 30,
        max_num_seqs=args.batch,
        max_num_batched_tokens=args.budget,
        cpu_fast_paths=not args.no_fast_paths,
        # Plain decode steps: one token per sequence, and no sequence ends
        # early on accepted drafts.
        speculative_method=None,
    )
    torch.set_num_threads(args.threads)
    wait_policy = os.environ.get("OMP_WAIT_POLICY")
    prefix = f"OMP_WAIT_POLICY={wait_policy} " if wait_policy else ""
    arguments = " ".join(argv if argv is not None else sys.argv[1:])
    report(f"$ {prefix}python -m bench.decode_step {arguments}".rstrip())
    report(f"CPU fast paths: {engine.cpu_fast_paths or 'off'}; dtype {engine.runner.dtype}")
    report(f"KV cache: {engine.config.cache_dtype}, {engine.config.num_kv_blocks} blocks")
    rng = random.Random(0)
    # Enough tokens for every timed step; not more, since the scheduler
    # admits only the sequences whose max_tokens fit the KV pool.
    # Sequences prefilled early decode during the later prefill steps.
    lengths = [rng.randint(16, args.max_prompt) for _ in range(args.batch)]
    prefill_steps = -(-sum(lengths) // args.budget) + args.batch
    params = SamplingParams(
        max_tokens=prefill_steps + args.steps + args.profile_steps + 10 * args.ab_blocks + 8,
        temperature=0.0,
        ignore_eos=True,
    )
    for i, length in enumerate(lengths):
        engine.add_request(f"r{i}", [rng.randrange(100, 49000) for _ in range(length)], params)
    started = time.perf_counter()
    steps = 0
    while engine.stats()["waiting"] or any(s.is_prefilling for s in engine.scheduler.running):
        engine.step()
        steps += 1
    report(
        f"prefill: {sum(lengths)} tokens in {steps} steps, {time.perf_counter() - started:.2f} s"
    )

    runner = engine.runner
    timers = Timers()
    runner.model.forward = timers.wrap(runner.model.forward, "forward")
    runner.prepare = timers.wrap(runner.prepare, "prepare")
    sample = runner_module.sample
    runner_module.sample = timers.wrap(sample, "sampling")
    try:
        for _ in range(3):  # warm-up
            engine.step()
        wall, fastest, cpu = time_steps(engine, args.steps, timers)
    finally:
        runner_module.sample = sample
        del runner.model.forward
        del runner.prepare
    if len(engine.scheduler.running) != args.batch:
        raise SystemExit(f"only {len(engine.scheduler.running)} sequences left decoding")
    report(
        f"decode step, batch {args.batch}, {args.threads} threads, mean of {args.steps}: "
        f"{wall * 1e3:.2f} ms wall (fastest {fastest * 1e3:.2f}), {cpu * 1e3:.2f} ms CPU"
    )
    report(f"  {'':<24} {'wall ms':>8} {'CPU ms':>8}")
    for label in ("forward", "prepare", "sampling"):
        report(
            f"  {label:<24} {timers.seconds[label] / args.steps * 1e3:8.2f}"
            f" {timers.cpu[label] / args.steps * 1e3:8.2f}"
        )
    report(
        f"  {'engine around them':<24} {(wall - sum(timers.seconds.values()) / args.steps) * 1e3:8.2f}"
        f" {(cpu - sum(timers.cpu.values()) / args.steps) * 1e3:8.2f}"
    )
    weights = decode_weight_bytes(runner.model)
    wall_bw, cpu_bw = stream_bandwidth(args.threads)
    limit, cpu_limit = weights / wall_bw, weights / cpu_bw
    report(
        f"weight-streaming limit: {weights / 1e6:.0f} MB of weights over a streaming read's "
        f"{wall_bw / 1e9:.1f} GB/s by wall time = {limit * 1e3:.2f} ms, "
        f"{cpu_bw / 1e9:.1f} GB/s per thread's CPU time = {cpu_limit * 1e3:.2f} ms"
    )
    report(
        f"step / limit: {wall / limit:.2f}x by wall time (fastest step {fastest / limit:.2f}x), "
        f"{cpu / args.threads / cpu_limit:.2f}x by CPU time per thread"
    )
    if args.ab_blocks and runner.model.decode_layers is not None:
        report(f"interleaved, {args.ab_blocks} blocks of 5 steps each:")
        for name, (w, c) in interleaved(engine, args.ab_blocks).items():
            report(f"  {name:<24} {w * 1e3:8.2f} ms wall {c * 1e3:8.2f} ms CPU")
    if args.profile_steps:
        timers = kernel_profile(engine, args.profile_steps)
        n = args.profile_steps
        forward, forward_cpu = timers.seconds.pop("forward"), timers.cpu.pop("forward")
        report(
            f"forward through the Python layer loop with timers, mean of {n}: "
            f"{forward / n * 1e3:.2f} ms wall, {forward_cpu / n * 1e3:.2f} ms CPU"
        )
        report(f"  {'':<28} {'wall ms':>8} {'CPU ms':>8} {'CPU %':>6}")
        for label, seconds in sorted(timers.cpu.items(), key=lambda kv: -kv[1]):
            report(
                f"  {label:<28} {timers.seconds[label] / n * 1e3:8.2f} {seconds / n * 1e3:8.2f}"
                f" {seconds / forward_cpu:6.1%}"
            )
        other = forward - sum(timers.seconds.values())
        other_cpu = forward_cpu - sum(timers.cpu.values())
        report(
            f"  {'Python and torch ops around':<28} {other / n * 1e3:8.2f} {other_cpu / n * 1e3:8.2f}"
            f" {other_cpu / forward_cpu:6.1%}"
        )
    if args.output:
        with open(args.output, "a") as out:
            out.write("\n".join(lines) + "\n\n")


if __name__ == "__main__":
    main()
