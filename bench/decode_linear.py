"""A decode step's linears, oneDNN vs the tile kernels: ``python -m bench.decode_linear``.

The demo model's decoder-layer shapes (q/k/v 576->960, o 576->576,
gate/up 576->3072, down 1536->576) for ``--layers`` layers of distinct
random weights, so each step reads them from DRAM as a real one does, and
the LM head (576->49152), at a few decode batch sizes. Prints per shape the
time of a call (microseconds, mean over ``--steps`` steps after warm-up) and
the weights read per second over the whole step, for oneDNN's packed
matmul (``PackedLinear``, what runs without the kernels) and this
machine's compiled tile kernel (``AmxLinear`` with AMX, else
``Dpbf16Linear`` with AVX512_BF16), alternating; asserts nothing.

``--paths kernel,int8`` compares the bfloat16 tile kernel with the same
kernel on weight-only int8 weights (engine/cpu/int8_linear.py, what
``EngineConfig.quantization = "int8"`` runs); GB/s is then of the bytes
each path reads (half for int8).
"""

from __future__ import annotations

import argparse
import time

import torch

from gpuworkers.engine.cpu import build
from gpuworkers.engine.cpu.int8_linear import int8_tile_linear_kind
from gpuworkers.engine.cpu.packing import PACKING_ROWS_HINT
from gpuworkers.engine.cpu.tile_linear import tile_linear_kind

SHAPES = {
    "qkv": (576, 960),
    "o": (576, 576),
    "gate_up": (576, 3072),
    "down": (1536, 576),
    "lm_head": (576, 49152),
}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--layers", type=int, default=30)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--rows", default="1,8,24,32")
    parser.add_argument(
        "--paths", default="oneDNN,kernel", help="of oneDNN, kernel (bfloat16), int8"
    )
    args = parser.parse_args(argv)
    paths = args.paths.split(",")
    if not paths or set(paths) - {"oneDNN", "kernel", "int8"}:
        raise SystemExit("--paths: a comma-separated list of oneDNN, kernel, int8")
    lib = build.cpu_library()
    kind, int8_kind = tile_linear_kind(lib), int8_tile_linear_kind(lib)
    if kind is None or int8_kind is None:
        raise SystemExit("no tile linear kernel on this machine (neither AMX nor AVX512_BF16)")
    torch.set_num_threads(args.threads)
    gen = torch.Generator().manual_seed(0)
    # Per layer (the LM head once): each path's module.
    layers = []
    for index in range(args.layers):
        layer = {}
        for name, (in_features, out_features) in SHAPES.items():
            if name == "lm_head" and index:
                continue
            linear = torch.nn.Linear(in_features, out_features, bias=False)
            with torch.no_grad():
                linear.weight.copy_(torch.randn(out_features, in_features, generator=gen))
            linear = linear.to(torch.bfloat16)
            layer[name] = {path: build_path(path, linear, lib, kind, int8_kind) for path in paths}
        layers.append(layer)
    weights = sum(
        in_features * out_features * (1 if index == 0 or name != "lm_head" else 0)
        for index in range(args.layers)
        for name, (in_features, out_features) in SHAPES.items()
    )
    step_bytes = {path: weights * (1 if path == "int8" else 2) for path in paths}
    print(
        f"{args.threads} threads, {args.layers} layers + LM head, "
        f"{weights * 2 / 2**20:.0f} MiB of bfloat16 weights per step; microseconds per call"
    )
    print(f"{'rows':>4} {'path':7} " + " ".join(f"{n:>8}" for n in SHAPES) + "   step ms   GB/s")
    for rows in (int(r) for r in args.rows.split(",")):
        inputs = {
            name: torch.randn(rows, in_features, generator=gen).to(torch.bfloat16)
            for name, (in_features, _) in SHAPES.items()
        }
        spent = {path: dict.fromkeys(SHAPES, 0.0) for path in paths}
        for step in range(args.steps + 2):
            for path in spent:
                for layer in layers:
                    for name, modules in layer.items():
                        x = inputs[name]
                        started = time.perf_counter()
                        modules[path](x)
                        if step >= 2:  # the first steps create primitives
                            spent[path][name] += time.perf_counter() - started
        for path, times in spent.items():
            calls = {n: args.steps * (1 if n == "lm_head" else args.layers) for n in SHAPES}
            per_call = " ".join(f"{times[n] / calls[n] * 1e6:8.1f}" for n in SHAPES)
            step = sum(times.values()) / args.steps
            print(
                f"{rows:4d} {path:7} {per_call}   {step * 1e3:7.2f}"
                f"  {step_bytes[path] / step / 1e9:5.1f}"
            )


def build_path(path: str, linear: torch.nn.Linear, lib, kind, int8_kind):
    """A callable running ``linear`` on one path."""
    if path == "kernel":
        return kind(lib, linear)
    if path == "int8":
        return int8_kind(lib, linear)
    onednn = torch.ops.mkldnn._reorder_linear_weight(linear.weight, PACKING_ROWS_HINT)
    return lambda x: torch.ops.mkldnn._linear_pointwise(x, onednn, None, "none", [], "")


if __name__ == "__main__":
    main()
