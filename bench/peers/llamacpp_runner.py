"""llama.cpp's own tools on the demo model: single-stream decode speed and
perplexity per GGUF format (bf16, Q8_0, Q4_0), for bench.quant.

``bench/peers/install_llamacpp.sh`` builds the tools and the files under
.peers/llamacpp/. ``llama-bench -p 0 -n N`` times generating N tokens after
an empty prompt, one sequence (its "tg" test): the figure llama.cpp's users
quote for single-stream speed. ``llama-perplexity`` scores a text file in
windows of ``ctx`` tokens. Standard library only.
"""

from __future__ import annotations

import json
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FOLDER = ROOT / ".peers" / "llamacpp"
FORMATS = ("bf16", "Q8_0", "Q4_0")


@dataclass(slots=True, frozen=True)
class LlamaCppTools:
    bench: Path
    perplexity: Path

    @classmethod
    def find(cls) -> LlamaCppTools | None:
        """The built tools, or None where install_llamacpp.sh has not run."""
        for bin_dir in sorted(FOLDER.glob("llama_cpp_python-*/vendor/llama.cpp/build/bin")):
            tools = cls(bin_dir / "llama-bench", bin_dir / "llama-perplexity")
            if tools.bench.exists() and tools.perplexity.exists():
                return tools
        return None


def model_file(fmt: str) -> Path:
    return FOLDER / "gguf" / f"smollm2-{fmt}.gguf"


@dataclass(slots=True, frozen=True)
class DecodeSpeed:
    tok_per_s: float
    stddev: float
    tokens: int
    repetitions: int


def decode_speed(
    tools: LlamaCppTools, fmt: str, threads: int, tokens: int, reps: int
) -> DecodeSpeed:
    out = subprocess.run(
        [
            str(tools.bench),
            "-m",
            str(model_file(fmt)),
            "-p",
            "0",
            "-n",
            str(tokens),
            "-t",
            str(threads),
            "-r",
            str(reps),
            "-o",
            "json",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    (row,) = json.loads(out)
    return DecodeSpeed(row["avg_ts"], row["stddev_ts"], tokens, reps)


PPL_LINE = re.compile(r"Final estimate: PPL = ([0-9.]+)")


def perplexity(tools: LlamaCppTools, fmt: str, text_file: Path, threads: int, ctx: int) -> float:
    """llama.cpp's perplexity of ``text_file`` (windows of ``ctx`` tokens,
    each scored on its second half, as llama-perplexity does)."""
    result = subprocess.run(
        [
            str(tools.perplexity),
            "-m",
            str(model_file(fmt)),
            "-f",
            str(text_file),
            "-c",
            str(ctx),
            "-t",
            str(threads),
            # Its runtime weight repacking (the AMX / extra buffer types)
            # died of SIGILL on Q8_0 at 256-token batches on an Intel Xeon
            # with AMX (2026-12-04); the format's arithmetic is the same
            # without it, and speed is not measured here.
            "--no-repack",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    match = PPL_LINE.search(result.stdout + result.stderr)
    if match is None:
        raise RuntimeError(f"llama-perplexity printed no estimate for {fmt}")
    return float(match.group(1))
