"""Named workloads for side-by-side runs (bench/pairs.py), one shape each.

Every peer reads the same prompts (token ids) and output lengths, with
``ignore_eos`` so that every peer makes the same number of tokens. The
headline suites (``HEADLINE``, bench.pairs' default) are:

- ``chat-sampled``: 40 real-text chat requests at once (user messages of
  bench/data/chat_prompts.jsonl, 4..900 tokens, through the chat
  template), 64..256 tokens out, temperature 0.8, top_p 0.95.
- ``decode-heavy``: 32 random-token requests at once, prompts 32..128,
  outputs 128..384, greedy (generation dominates; decode batches near 32).
- ``prefill-heavy``: 48 random-token requests at once, prompts 32..768,
  outputs 16..192, greedy (prompt tokens dominate).
- ``single-stream-sampled``: 5 real-text chat requests one at a time, 160
  tokens out each, temperature 0.8, top_p 0.95 (a batch of one: the
  per-step cost one user sees).
- ``copy-edit``: 12 requests at once, each asking to copy a real passage of
  150..290 words with its misspellings fixed (bench/data/edit_passages*.txt),
  192..256 tokens out, temperature 0.8, top_p 0.95: the reply prompt-lookup
  drafting is for, sampled.

Older suites, by name only: ``single-stream`` (4 random-token requests of
384 tokens, 160 out, one at a time, greedy), ``multiturn`` (8 conversations
of 4 turns on a shared 256-token system prompt: prefix-cache reuse across
turns) and ``repetition`` (copy-edit of the 4 passages of
edit_passages.txt, one at a time, greedy).

Greedy random-token prompts make outputs that loop, which prompt-lookup
speculation feeds on: they measure the engine at a shape, not what users
see. Each suite's ``quick`` shape is for smoke runs (``--quick``).
"""

from __future__ import annotations

from dataclasses import dataclass

from bench.workloads import WorkloadShape

SAMPLED = (0.8, 0.95)
GREEDY = (0.0, 1.0)


def offline_shape(requests: int, prompt: tuple[int, int], out: tuple[int, int]) -> WorkloadShape:
    return WorkloadShape(requests, *prompt, *out, 0, 0, 0, 0, 0)


@dataclass(slots=True, frozen=True)
class Suite:
    name: str
    shape: WorkloadShape
    quick: WorkloadShape
    # The runner phase that drives it: offline, sequential or multiturn.
    phase: str
    # "random": random token ids (bench.workloads.build_workload); "chat":
    # real-text chat messages (build_chat_workload); "edit": copy-and-fix
    # the project's passages; "copy-edit": the same over Austen's too.
    prompts: str = "random"
    # (temperature, top_p) of every request.
    sampling: tuple[float, float] = GREEDY

    @property
    def greedy(self) -> bool:
        return self.sampling[0] == 0.0

    @property
    def drafts_from_prompt(self) -> bool:
        """Whether the reply copies its prompt: vLLM's ``ngram`` mode is
        tried here as on greedy suites, where it may be vLLM's best."""
        return self.greedy or self.prompts in ("edit", "copy-edit")


SUITES = {
    suite.name: suite
    for suite in (
        Suite(
            "chat-sampled",
            offline_shape(40, (0, 0), (64, 256)),
            offline_shape(8, (0, 0), (16, 48)),
            "offline",
            "chat",
            SAMPLED,
        ),
        Suite(
            "decode-heavy",
            offline_shape(32, (32, 128), (128, 384)),
            offline_shape(8, (32, 64), (32, 64)),
            "offline",
        ),
        Suite(
            "prefill-heavy",
            offline_shape(48, (32, 768), (16, 192)),
            offline_shape(8, (32, 384), (8, 32)),
            "offline",
        ),
        Suite(
            "single-stream-sampled",
            offline_shape(5, (0, 0), (160, 160)),
            offline_shape(2, (0, 0), (32, 32)),
            "sequential",
            "chat",
            SAMPLED,
        ),
        Suite(
            "copy-edit",
            offline_shape(12, (0, 0), (192, 256)),
            offline_shape(4, (0, 0), (48, 64)),
            "offline",
            "copy-edit",
            SAMPLED,
        ),
        Suite(
            "single-stream",
            offline_shape(4, (384, 384), (160, 160)),
            offline_shape(2, (128, 128), (32, 32)),
            "sequential",
        ),
        Suite(
            "multiturn",
            WorkloadShape(0, 0, 0, 0, 0, 8, 4, 256, 64, 64),
            WorkloadShape(0, 0, 0, 0, 0, 2, 2, 64, 16, 16),
            "multiturn",
        ),
        Suite(
            "repetition",
            offline_shape(4, (0, 0), (224, 224)),
            offline_shape(2, (0, 0), (48, 48)),
            "sequential",
            "edit",
        ),
    )
}
HEADLINE = ("chat-sampled", "decode-heavy", "prefill-heavy", "single-stream-sampled", "copy-edit")
