"""Named workloads for side-by-side runs (bench/pairs.py), one shape each.

Every engine reads the same prompts (token ids) and output lengths, greedy
with ``ignore_eos``; which runner phase drives them is part of the suite:

- ``decode-heavy``: 32 requests at once, prompts 32..128, outputs 128..384
  (generation dominates; decode batches near 32).
- ``prefill-heavy``: 48 requests at once, prompts 32..768, outputs 16..192
  (prompt tokens dominate).
- ``single-stream``: 4 requests of 384 prompt tokens and 160 output tokens,
  one at a time (a batch of one: the per-step cost one user sees).
- ``multiturn``: 8 conversations of 4 turns on a shared 256-token system
  prompt (prefix-cache reuse across turns).
- ``repetition``: 4 requests one at a time, each asking to copy a passage
  of about 270 tokens with its misspellings fixed, 224 output tokens (real
  text, bench/data/edit_passages.txt: where prompt-lookup drafting helps).
"""

from __future__ import annotations

from dataclasses import dataclass

from bench.workloads import WorkloadShape


@dataclass(slots=True, frozen=True)
class Suite:
    name: str
    shape: WorkloadShape
    # The runner phase that drives it: offline, sequential or multiturn.
    phase: str
    # "random": random token ids (bench.workloads.build_workload); "edit":
    # copy-and-fix-a-passage chat prompts (build_edit_workload).
    prompts: str = "random"


SUITES = {
    suite.name: suite
    for suite in (
        Suite("decode-heavy", WorkloadShape(32, 32, 128, 128, 384, 0, 0, 0, 0, 0), "offline"),
        Suite("prefill-heavy", WorkloadShape(48, 32, 768, 16, 192, 0, 0, 0, 0, 0), "offline"),
        Suite("single-stream", WorkloadShape(4, 384, 384, 160, 160, 0, 0, 0, 0, 0), "sequential"),
        Suite("multiturn", WorkloadShape(0, 0, 0, 0, 0, 8, 4, 256, 64, 64), "multiturn"),
        Suite("repetition", WorkloadShape(4, 0, 0, 224, 224, 0, 0, 0, 0, 0), "sequential", "edit"),
    )
}
