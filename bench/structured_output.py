"""Grammar-constrained decoding: ``python -m bench.structured_output``.

Part 1 (``--part libs``): the two candidate libraries, xgrammar and
llguidance, with the demo model's tokenizer (SmolLM2, 49152 tokens):
grammar compile time for json_object and three JSON schemas (a small
object, a nested one with arrays and enums, the tool-call array shape),
then the time to compute one step's token bitmask at batch 1 (one matcher
walking a valid instance token by token) and batch 64 (64 matchers at
staggered positions of the instances, the library's parallel fill). A
library that is not installed is skipped; the results JSON keeps the
figures of the last run that had it.

Part 2 (``--part overhead``): the engine offline (bfloat16), tok/s with a
json_schema on every request against the same requests unconstrained, at
batch 1 and 32 (greedy, ``--max-tokens`` outputs each, runs alternating),
and the grammar's own time (masks and advances) per step and as a share
of the constrained runs' wall time.

Prints the tables and merges each part into ``--out`` (JSON). Asserts
nothing.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

from tokenization.tokenizer import load_tokenizer

MODEL_DIR = Path.home() / ".cache/llm-platform/models/smollm2-135m-instruct"
OUT = Path(__file__).parent / "results" / "structured-output.json"

SMALL = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 24},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
    },
    "required": ["name", "age"],
    "additionalProperties": False,
}
NESTED = {
    "type": "object",
    "properties": {
        "title": {"type": "string"},
        "status": {"enum": ["draft", "review", "published"]},
        "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 5},
        "author": {
            "type": "object",
            "properties": {
                "name": {"type": "string"},
                "email": {"type": "string"},
                "roles": {"type": "array", "items": {"enum": ["admin", "editor", "viewer"]}},
            },
            "required": ["name", "roles"],
            "additionalProperties": False,
        },
        "score": {"type": "number"},
    },
    "required": ["title", "status", "tags", "author"],
    "additionalProperties": False,
}
TOOL_CALLS = {
    "type": "array",
    "minItems": 1,
    "items": {
        "anyOf": [
            {
                "type": "object",
                "properties": {
                    "name": {"const": "get_weather"},
                    "parameters": {
                        "type": "object",
                        "properties": {
                            "city": {"type": "string"},
                            "unit": {"enum": ["celsius", "fahrenheit"]},
                        },
                        "required": ["city"],
                        "additionalProperties": False,
                    },
                },
                "required": ["name", "parameters"],
                "additionalProperties": False,
            },
            {
                "type": "object",
                "properties": {
                    "name": {"const": "search"},
                    "parameters": {
                        "type": "object",
                        "properties": {
                            "query": {"type": "string"},
                            "limit": {"type": "integer"},
                        },
                        "required": ["query"],
                        "additionalProperties": False,
                    },
                },
                "required": ["name", "parameters"],
                "additionalProperties": False,
            },
        ]
    },
}
# (schema or None for json_object, a valid instance the matchers walk).
CASES = {
    "json_object": (
        None,
        {"id": 7, "items": [{"sku": "A-1", "qty": 2}], "note": "leave at the door", "ok": True},
    ),
    "small": (SMALL, {"name": "Ada Lovelace", "age": 36}),
    "nested": (
        NESTED,
        {
            "title": "Paged attention explained",
            "status": "review",
            "tags": ["kv", "cache", "vllm"],
            "author": {"name": "Lin", "email": "lin@example.com", "roles": ["editor", "viewer"]},
            "score": 4.5,
        },
    ),
    "tool_calls": (
        TOOL_CALLS,
        [
            {"name": "get_weather", "parameters": {"city": "Paris", "unit": "celsius"}},
            {"name": "search", "parameters": {"query": "museums in Paris", "limit": 5}},
        ],
    ),
}
COMPILE_REPEAT = 5
MASK_REPEAT = 5


def _compact(value) -> str:
    return json.dumps(value, separators=(",", ":"))


def _stats(samples: list[float]) -> dict:
    ordered = sorted(samples)
    p99 = ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]
    return {"mean_us": statistics.fmean(ordered) * 1e6, "p99_us": p99 * 1e6, "n": len(ordered)}


class XGrammar:
    name = "xgrammar"

    def __init__(self, tokenizer, vocab_size: int):
        import xgrammar as xgr

        self.xgr = xgr
        start = time.perf_counter()
        self.info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab_size)
        self.tokenizer_s = time.perf_counter() - start
        self.vocab_size = vocab_size
        self.batch = xgr.BatchGrammarMatcher()

    def compile(self, schema):
        # A fresh compiler each time: its cache would turn repeats into look-ups.
        compiler = self.xgr.GrammarCompiler(self.info, cache_enabled=False)
        text = _compact(schema or {"type": "object"})
        return compiler.compile_json_schema(text, any_whitespace=False, separators=(",", ":"))

    def matcher(self, compiled):
        return self.xgr.GrammarMatcher(compiled)

    def bitmask(self, rows: int) -> torch.Tensor:
        return self.xgr.allocate_token_bitmask(rows, self.vocab_size)

    def fill_one(self, matcher, bitmask) -> None:
        matcher.fill_next_token_bitmask(bitmask, 0)

    def fill_batch(self, matchers, bitmask) -> None:
        self.batch.batch_fill_next_token_bitmask(matchers, bitmask)

    def accept(self, matcher, token: int) -> bool:
        return matcher.accept_token(token)

    def reset(self, matcher) -> None:
        matcher.reset()


class LLGuidance:
    name = "llguidance"

    def __init__(self, tokenizer, vocab_size: int):
        import llguidance
        import llguidance.hf
        import llguidance.torch

        self.llg = llguidance
        self.lltorch = llguidance.torch
        start = time.perf_counter()
        self.tok = llguidance.hf.from_tokenizer(tokenizer, n_vocab=vocab_size)
        self.tokenizer_s = time.perf_counter() - start
        self.vocab_size = vocab_size
        self.executor = llguidance.LLExecutor()

    def compile(self, schema):
        # llguidance builds its lexer lazily, per matcher: "compile" here is
        # the grammar, its validation and the first matcher.
        grammar = self.llg.LLMatcher.grammar_from_json_schema(
            schema or {"type": "object"},
            defaults={"whitespace_flexible": False, "item_separator": ",", "key_separator": ":"},
        )
        error = self.llg.LLMatcher.validate_grammar(grammar, self.tok)
        if error:
            raise ValueError(error)
        matcher = self.llg.LLMatcher(self.tok, grammar)
        return grammar if not matcher.is_error() else None

    def matcher(self, compiled):
        return self.llg.LLMatcher(self.tok, compiled)

    def bitmask(self, rows: int) -> torch.Tensor:
        return self.lltorch.allocate_token_bitmask(rows, self.vocab_size)

    def fill_one(self, matcher, bitmask) -> None:
        self.lltorch.fill_next_token_bitmask(matcher, bitmask, 0)

    def fill_batch(self, matchers, bitmask) -> None:
        pairs = [(m, i) for i, m in enumerate(matchers)]
        self.lltorch.fill_next_token_bitmask_par(self.executor, pairs, bitmask)

    def accept(self, matcher, token: int) -> bool:
        return matcher.consume_token(token)

    def reset(self, matcher) -> None:
        matcher.reset()


def _import_seconds(module: str) -> float:
    """Import time in a fresh interpreter (after torch, which the engine
    has loaded anyway): what a worker or web process pays at start."""
    code = (
        "import time, torch, transformers; s = time.perf_counter(); "
        f"import {module}; print(time.perf_counter() - s)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return float(done.stdout.strip())


def bench_library(cls, tokenizer, vocab_size: int, eos: int) -> dict:
    import_s = _import_seconds(cls.name)
    lib = cls(tokenizer, vocab_size)
    result = {
        "import_s": import_s,
        "tokenizer_setup_s": lib.tokenizer_s,
        "compile_ms": {},
        "mask": {},
    }
    walks = {}
    for case, (schema, instance) in CASES.items():
        times = []
        for _ in range(COMPILE_REPEAT):
            start = time.perf_counter()
            compiled = lib.compile(schema)
            times.append(time.perf_counter() - start)
        result["compile_ms"][case] = {
            "first": times[0] * 1e3,
            "median": statistics.median(times) * 1e3,
        }
        tokens = tokenizer.encode(_compact(instance), add_special_tokens=False) + [eos]
        walks[case] = (compiled, tokens)
    for case, (compiled, tokens) in walks.items():
        matcher = lib.matcher(compiled)
        bitmask = lib.bitmask(1)
        samples = []
        for _ in range(MASK_REPEAT):
            lib.reset(matcher)
            for token in tokens:
                start = time.perf_counter()
                lib.fill_one(matcher, bitmask)
                samples.append(time.perf_counter() - start)
                if not lib.accept(matcher, token):
                    raise RuntimeError(f"{lib.name} refused a token of the {case} instance")
        result["mask"][f"batch1/{case}"] = _stats(samples)
    result["mask"]["batch64/mixed"] = _stats(_batch_walk(lib, walks, 64))
    return result


def _batch_walk(lib, walks: dict, rows: int) -> list[float]:
    """64 matchers over the four instances, each starting at a different
    offset, so a step mixes grammars and positions as a serving batch does."""
    cases = list(walks.values())
    lanes = []
    for i in range(rows):
        compiled, tokens = cases[i % len(cases)]
        matcher = lib.matcher(compiled)
        offset = (i * 7) % (len(tokens) - 1)
        for token in tokens[:offset]:
            lib.accept(matcher, token)
        lanes.append([matcher, tokens, offset])
    bitmask = lib.bitmask(rows)
    samples = []
    for _ in range(40 * MASK_REPEAT):
        matchers = [lane[0] for lane in lanes]
        start = time.perf_counter()
        lib.fill_batch(matchers, bitmask)
        samples.append(time.perf_counter() - start)
        for lane in lanes:
            matcher, tokens, position = lane
            lib.accept(matcher, tokens[position])
            lane[2] += 1
            if lane[2] == len(tokens):
                lib.reset(matcher)
                lane[2] = 0
    return samples


def run_libs(args) -> dict:
    tokenizer = load_tokenizer(MODEL_DIR)
    vocab_size = json.loads((MODEL_DIR / "config.json").read_text())["vocab_size"]
    results = {}
    for cls in (XGrammar, LLGuidance):
        try:
            __import__(cls.name)
        except ImportError:
            print(f"{cls.name}: not installed, skipped")
            continue
        gc.collect()
        results[cls.name] = bench_library(cls, tokenizer, vocab_size, tokenizer.eos_token_id)
    _print_libs(results)
    return results


def _print_libs(results: dict) -> None:
    names = list(results)
    if not names:
        return
    print(f"\n{'compile (ms, first / median of 5)':36}" + "".join(f"{n:>22}" for n in names))
    for case in CASES:
        cells = []
        for n in names:
            c = results[n]["compile_ms"][case]
            cells.append(f"{c['first']:9.1f} / {c['median']:8.1f}")
        print(f"{case:36}" + "".join(f"{c:>22}" for c in cells))
    print(f"\n{'bitmask per step (us, mean / p99)':36}" + "".join(f"{n:>22}" for n in names))
    for row in results[names[0]]["mask"]:
        cells = []
        for n in names:
            m = results[n]["mask"][row]
            cells.append(f"{m['mean_us']:9.1f} / {m['p99_us']:8.1f}")
        print(f"{row:36}" + "".join(f"{c:>22}" for c in cells))
    for key in ("import_s", "tokenizer_setup_s"):
        print(f"{key:36}" + "".join(f"{results[n][key]:>22.2f}" for n in names))


class GrammarTimer:
    """Wall time spent in the grammar's own work during a run: the step's
    masks (fill, unpack, ``where``) and each token's advance. Measured
    directly because on a shared machine the tok/s of two runs can differ
    by more than the whole grammar cost."""

    def __init__(self):
        from gpuworkers.engine.sampling import sampler
        from gpuworkers.engine.structured.matcher import GrammarState

        self.seconds = 0.0
        self.steps = 0
        apply, advance = sampler.apply_grammars, GrammarState.advance

        def timed_apply(scores, samples):
            start = time.perf_counter()
            try:
                return apply(scores, samples)
            finally:
                self.seconds += time.perf_counter() - start
                self.steps += 1

        def timed_advance(state, token):
            start = time.perf_counter()
            try:
                return advance(state, token)
            finally:
                self.seconds += time.perf_counter() - start

        sampler.apply_grammars = timed_apply
        GrammarState.advance = timed_advance


def run_overhead(args) -> dict:
    from gpuworkers.engine import LLMEngine, SamplingParams

    engine = LLMEngine.from_pretrained(
        MODEL_DIR, dtype="auto", max_num_seqs=64, enable_prefix_caching=False
    )
    engine.warmup()
    timer = GrammarTimer()
    # minItems far beyond max_tokens: the grammar never ends a choice early,
    # so both runs generate the same number of tokens.
    schema = {"type": "array", "items": SMALL, "minItems": 64}
    structured = {"type": "json_schema", "schema": schema, "strict": True}
    results = {}
    for batch in (1, 32):
        prompts = [f"List people as JSON, variant {i}." for i in range(batch)]
        runs = {"unconstrained": [], "json_schema": []}
        grammar_s, grammar_steps, elapsed_constrained = 0.0, 0, 0.0
        for _ in range(args.repeat):
            # Alternating, so a change in machine load hits both alike.
            for label in runs:
                extra = {"structured_output": structured} if label == "json_schema" else {}
                params = SamplingParams(
                    max_tokens=args.max_tokens, temperature=0.0, ignore_eos=True, **extra
                )
                before_s, before_steps = timer.seconds, timer.steps
                start = time.perf_counter()
                outputs = engine.generate(prompts, params)
                elapsed = time.perf_counter() - start
                tokens = sum(len(c.token_ids) for o in outputs for c in o.choices)
                runs[label].append(tokens / elapsed)
                if extra:
                    grammar_s += timer.seconds - before_s
                    grammar_steps += timer.steps - before_steps
                    elapsed_constrained += elapsed
        row = {label: {"tok_s": statistics.median(v), "runs": v} for label, v in runs.items()}
        row["tok_s_cost_pct"] = 100 * (
            1 - row["json_schema"]["tok_s"] / row["unconstrained"]["tok_s"]
        )
        row["grammar_ms_per_step"] = 1e3 * grammar_s / max(grammar_steps, 1)
        row["grammar_share_pct"] = 100 * grammar_s / elapsed_constrained
        results[f"batch{batch}"] = row
    print(
        f"\n{'engine, greedy, median tok/s':30}{'unconstrained':>15}{'json_schema':>13}"
        f"{'tok/s cost':>12}{'grammar ms/step':>17}{'grammar share':>15}"
    )
    for key, row in results.items():
        print(
            f"{key:30}{row['unconstrained']['tok_s']:15.1f}{row['json_schema']['tok_s']:13.1f}"
            f"{row['tok_s_cost_pct']:11.1f}%{row['grammar_ms_per_step']:17.1f}"
            f"{row['grammar_share_pct']:14.1f}%"
        )
    return {"max_tokens": args.max_tokens, "repeat": args.repeat, **results}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--part", choices=["libs", "overhead", "all"], default="all")
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args(argv)
    torch.set_num_threads(int(os.environ.get("BENCH_THREADS", "2")))
    merged = json.loads(args.out.read_text()) if args.out.exists() else {}
    merged.pop("command", None)
    command = " ".join(["python -m bench.structured_output", *sys.argv[1:]])
    machine = {
        "cpu": platform.processor() or platform.machine(),
        "cores": os.cpu_count(),
        "loadavg_start": os.getloadavg(),
        "torch": torch.__version__,
    }
    if args.part in ("libs", "all"):
        libs = run_libs(args)
        merged.setdefault("libraries", {}).update(libs)
        merged["libraries_machine"] = machine
        merged["libraries_command"] = command
    if args.part in ("overhead", "all"):
        merged["overhead"] = run_overhead(args)
        merged["overhead_machine"] = machine
        merged["overhead_command"] = command
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(merged, indent=2) + "\n")
    print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()
