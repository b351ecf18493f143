"""Model FLOPs per token, and this machine's measured bfloat16 matmul peak.

FLOPs to produce one token whose position attends to ``context`` tokens::

    2 * (non-embedding params + lm head params)      # every weight: a multiply-add
    + 4 * layers * heads * head_dim * context          # q.k scores and p.v sums

The embedding lookup is a gather (no FLOPs); a tied lm head still costs its
matmul, so it is counted even though it shares the embedding's weights. Norm
weights count as parameters (a rounding error). For SmolLM2-135M that is
about 269 MFLOP plus 0.07 MFLOP per token of context.

The peak is ``torch.nn.functional.linear`` in bfloat16 on the model's own
weight shapes with M rows (M >= 512, the benchmark's thread count),
combined the way one forward pass uses them: total FLOPs of every linear of
every layer plus the lm head, divided by their total time. It is the
ceiling for this model's matmuls on this machine; ``decode_peak_fraction``
in bench/engine.py is the engine's large-batch decode FLOP/s over it.

    python -m bench.flops --model-dir DIR --threads 2 --out peak.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path


@dataclass(slots=True, frozen=True)
class ModelShape:
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int

    @classmethod
    def from_dir(cls, model_dir: Path) -> ModelShape:
        cfg = json.loads((Path(model_dir) / "config.json").read_text())
        heads = cfg["num_attention_heads"]
        return cls(
            layers=cfg["num_hidden_layers"],
            hidden=cfg["hidden_size"],
            heads=heads,
            kv_heads=cfg.get("num_key_value_heads", heads),
            head_dim=cfg.get("head_dim") or cfg["hidden_size"] // heads,
            intermediate=cfg["intermediate_size"],
            vocab=cfg["vocab_size"],
        )

    def layer_linears(self) -> list[tuple[int, int]]:
        """(in, out) of each linear in one decoder layer: q, k, v, o, gate, up, down."""
        h, q, kv, i = (
            self.hidden,
            self.heads * self.head_dim,
            self.kv_heads * self.head_dim,
            self.intermediate,
        )
        return [(h, q), (h, kv), (h, kv), (q, h), (h, i), (h, i), (i, h)]

    def matmul_params(self) -> int:
        """Non-embedding params that take part in matmuls, plus the lm head."""
        per_layer = sum(a * b for a, b in self.layer_linears())
        norms = self.layers * 2 * self.hidden + self.hidden
        return self.layers * per_layer + norms + self.hidden * self.vocab

    def flops_per_token(self, context: int) -> float:
        attention = 4 * self.layers * self.heads * self.head_dim * context
        return 2 * self.matmul_params() + attention


def measure_peak(shape: ModelShape, *, rows: tuple[int, ...] = (512, 1024), seconds: float = 0.4):
    """bf16 linear GFLOP/s per weight shape and for one forward pass's mix."""
    import torch
    import torch.nn.functional as F

    per_shape: dict[str, float] = {}
    mix = {"median": 0.0, "best": 0.0}
    unique = {(a, b) for a, b in shape.layer_linears()} | {(shape.hidden, shape.vocab)}
    # One token's worth of every layer's linears plus the lm head.
    weights = [(s, shape.layers) for s in shape.layer_linears()]
    weights.append(((shape.hidden, shape.vocab), 1))
    for m in rows:
        times: dict[tuple[int, int], list[float]] = {}
        for k, n in sorted(unique):
            x = torch.randn(m, k, dtype=torch.bfloat16)
            w = torch.randn(n, k, dtype=torch.bfloat16)
            for _ in range(3):
                F.linear(x, w)
            samples = []
            deadline = time.perf_counter() + seconds
            while time.perf_counter() < deadline or len(samples) < 5:
                started = time.perf_counter()
                F.linear(x, w)
                samples.append(time.perf_counter() - started)
            times[(k, n)] = samples
            per_shape[f"M{m}_{k}x{n}"] = round(2 * m * k * n / statistics.median(samples) / 1e9, 1)
        flops = sum(2 * m * k * n * c for (k, n), c in weights)
        # The median call is the sustained rate the peak is quoted at; the
        # fastest call bounds what the hardware can do at all.
        for name, pick in (("median", statistics.median), ("best", min)):
            secs = sum(pick(times[s]) * c for s, c in weights)
            mix[name] = max(mix[name], flops / secs)
    return {
        "peak_gflops": round(mix["median"] / 1e9, 1),
        "peak_best_call_gflops": round(mix["best"] / 1e9, 1),
        "per_shape_gflops": per_shape,
        "rows": list(rows),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model-dir", type=Path, required=True)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    import torch

    torch.set_num_threads(args.threads)
    shape = ModelShape.from_dir(args.model_dir)
    print("[bench:peak] measuring bf16 linear peak on the model's shapes", file=sys.stderr)
    result = measure_peak(shape)
    result.update(
        threads=args.threads,
        flops_per_token_at_context_0=shape.flops_per_token(0),
        matmul_params=shape.matmul_params(),
        formula="2 * (non-embedding params + lm head) + 4 * layers * heads * head_dim * context",
    )
    args.out.write_text(json.dumps(result, indent=1))
    print(f"[bench:peak] {result['peak_gflops']} GFLOP/s", file=sys.stderr)


if __name__ == "__main__":
    main()
