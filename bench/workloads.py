"""Seeded workloads for bench/engine.py and bench/pairs.py, read by every peer.

Prompts are token ids, so that they are identical for all peers without
any tokenizer round trip. Two kinds:

- random token ids from the model's vocabulary with every special or added
  token left out (``build_workload``): throughput and latency at a given
  shape, where what the tokens say does not matter. Their greedy output
  loops, which flatters prompt-lookup speculation: not a headline workload.
- real text through the model's chat template (``build_chat_workload``,
  ``build_edit_workload``): user messages from bench/data/ (sources and
  licences in bench/data/README.md), usually sampled at temperature 0.8.

Two workloads (issue 2):

- ``offline``: N requests submitted at once, prompt lengths uniform in
  [prompt_min, prompt_max], output lengths uniform in [out_min, out_max],
  generated greedily with ``ignore_eos`` so every peer produces exactly the
  requested number of tokens.
- ``multiturn``: C conversations of T turns sharing one system prompt. Turn k
  sends system + (user_1, answer_1, ..., user_k); each answer is the peer's
  own generated tokens, so every peer sees the same prompt lengths, and the
  blocks of earlier turns are what a prefix cache can reuse.
"""

from __future__ import annotations

import json
import random
from dataclasses import asdict, dataclass, field
from pathlib import Path

DATA = Path(__file__).with_name("data")
# Passages of 240..290 tokens for the repetition-heavy suite, one per line.
EDIT_PASSAGES = DATA / "edit_passages.txt"
# Passages of Jane Austen's novels of 150..260 words, one per line.
AUSTEN_EDIT_PASSAGES = DATA / "edit_passages_austen.txt"
# Real-text chat user messages, one JSON object ({"source", "message"}) per line.
CHAT_PROMPTS = DATA / "chat_prompts.jsonl"
EDIT_INSTRUCTION = "Copy the following text exactly, correcting its spelling mistakes:\n\n"


@dataclass(slots=True)
class OfflineRequest:
    request_id: str
    prompt_token_ids: list[int]
    max_tokens: int


@dataclass(slots=True)
class Conversation:
    conversation_id: str
    # One list of user token ids per turn; answers are generated at run time.
    user_turns: list[list[int]]


@dataclass(slots=True)
class Workload:
    """Everything a peer runner needs; serialised as JSON for the subprocess."""

    seed: int
    vocab_size: int
    offline: list[OfflineRequest] = field(default_factory=list)
    system_prompt: list[int] = field(default_factory=list)
    conversations: list[Conversation] = field(default_factory=list)
    turn_max_tokens: int = 64
    # Every request's sampling: 0.0 is greedy. Always with ignore_eos, so
    # every peer makes the same number of tokens.
    temperature: float = 0.0
    top_p: float = 1.0

    def to_json(self, path: Path) -> None:
        path.write_text(json.dumps(asdict(self)))

    @classmethod
    def from_json(cls, path: Path) -> Workload:
        raw = json.loads(Path(path).read_text())
        return cls(
            seed=raw["seed"],
            vocab_size=raw["vocab_size"],
            offline=[OfflineRequest(**r) for r in raw["offline"]],
            system_prompt=raw["system_prompt"],
            conversations=[Conversation(**c) for c in raw["conversations"]],
            turn_max_tokens=raw["turn_max_tokens"],
            temperature=raw.get("temperature", 0.0),
            top_p=raw.get("top_p", 1.0),
        )


@dataclass(slots=True, frozen=True)
class WorkloadShape:
    """Sizes of both workloads; ``FULL`` is issue 2's, ``QUICK`` a smoke run."""

    num_requests: int
    prompt_min: int
    prompt_max: int
    out_min: int
    out_max: int
    conversations: int
    turns: int
    system_tokens: int
    user_tokens: int
    turn_max_tokens: int


FULL = WorkloadShape(64, 16, 1024, 8, 256, 16, 6, 256, 64, 64)
QUICK = WorkloadShape(8, 16, 128, 8, 32, 4, 3, 64, 16, 16)


def plain_token_ids(tokenizer, vocab_size: int) -> list[int]:
    """Token ids that are neither special nor added (no <|im_end|>, no EOS)."""
    excluded = set(tokenizer.all_special_ids)
    excluded.update(int(i) for i in getattr(tokenizer, "added_tokens_decoder", {}))
    return [i for i in range(vocab_size) if i not in excluded]


def build_workload(
    shape: WorkloadShape, *, allowed_ids: list[int], vocab_size: int, seed: int
) -> Workload:
    """Draw both workloads from one seeded generator: same seed, same prompts."""
    rng = random.Random(seed)

    def tokens(n: int) -> list[int]:
        return [rng.choice(allowed_ids) for _ in range(n)]

    offline = [
        OfflineRequest(
            request_id=f"off-{i}",
            prompt_token_ids=tokens(rng.randint(shape.prompt_min, shape.prompt_max)),
            max_tokens=rng.randint(shape.out_min, shape.out_max),
        )
        for i in range(shape.num_requests)
    ]
    system_prompt = tokens(shape.system_tokens)
    conversations = [
        Conversation(
            conversation_id=f"conv-{c}",
            user_turns=[tokens(shape.user_tokens) for _ in range(shape.turns)],
        )
        for c in range(shape.conversations)
    ]
    return Workload(
        seed=seed,
        vocab_size=vocab_size,
        offline=offline,
        system_prompt=system_prompt,
        conversations=conversations,
        turn_max_tokens=shape.turn_max_tokens,
    )


# A passage of about 300 tokens for the repetition-heavy workload: a reply
# that copies and edits it is what prompt-lookup drafting (engine/spec/)
# is for.
PASSAGE = (
    "The old lighthouse stood on the northern cliff for more than a century. Every night "
    "its keeper climbed the spiral stairs, trimmed the wick and wound the clockwork that "
    "turned the great lens. Ships passing the reef learned to trust its steady beam, and "
    "the village below grew up around the harbour it protected. Fishermen mended their "
    "nets on the quay, children raced along the sea wall, and in winter the storms threw "
    "spray as high as the lantern room. When the light was finally automated, the last "
    "keeper handed over his logbooks to the museum in town. They record forty years of "
    "weather, wrecks and rescues in a small, careful hand: the night the schooner Mary "
    "Ellen ran aground, the winter the bay froze solid, the summer a whale slept for a "
    "week beside the harbour mouth. Visitors still climb the cliff path on fine evenings "
    "to watch the beam sweep across the water, and the museum keeps the keeper's brass "
    "telescope polished on a shelf beside his chair. Some say that on calm nights you "
    "can still hear the clockwork turning, though the gears were removed long ago and "
    "the lens now turns on an electric motor that never needs winding."
)


def repetition_prompt(tokenizer) -> list[int]:
    """A chat prompt asking to repeat the passage with one edit."""
    from tokenization.tokenizer import apply_chat_template

    message = (
        "Repeat the following passage exactly, but write 'lamp' instead of 'lantern':\n\n" + PASSAGE
    )
    return apply_chat_template(tokenizer, [{"role": "user", "content": message}])


class PromptPool:
    """Items drawn without replacement in a seeded order: every round of a
    run gets fresh prompts until the pool runs out, then a new shuffle."""

    def __init__(self, items: list, *, seed: int) -> None:
        self.items = list(items)
        self.rng = random.Random(seed)
        self.order: list = []

    def take(self, count: int) -> list:
        out = []
        while len(out) < count:
            if not self.order:
                self.order = list(self.items)
                self.rng.shuffle(self.order)
            out.append(self.order.pop())
        return out


def chat_messages() -> list[str]:
    """The real-text chat user messages shipped in ``CHAT_PROMPTS``."""
    lines = CHAT_PROMPTS.read_text().splitlines()
    return [json.loads(line)["message"] for line in lines if line.strip()]


def edit_passages(*paths: Path) -> list[str]:
    """Passages for the copy-edit suites, one per line of each file."""
    return [line.strip() for p in paths for line in p.read_text().splitlines() if line.strip()]


def build_chat_workload(
    tokenizer, messages: list[str], shape: WorkloadShape, *, vocab_size: int, seed: int
) -> Workload:
    """One user message per request through the model's chat template;
    output lengths uniform in ``shape``'s [out_min, out_max] (the prompt
    lengths are the messages' own)."""
    from tokenization.tokenizer import apply_chat_template

    rng = random.Random(seed)
    offline = [
        OfflineRequest(
            request_id=f"chat-{i}",
            prompt_token_ids=apply_chat_template(tokenizer, [{"role": "user", "content": message}]),
            max_tokens=rng.randint(shape.out_min, shape.out_max),
        )
        for i, message in enumerate(messages)
    ]
    return Workload(seed=seed, vocab_size=vocab_size, offline=offline)


def build_edit_workload(
    tokenizer,
    shape: WorkloadShape,
    *,
    vocab_size: int,
    seed: int,
    passages: list[str] | None = None,
) -> Workload:
    """The repetition-heavy workload: each request asks the model to copy
    one passage (``passages``, by default those of ``EDIT_PASSAGES``, in
    turn) with a few misspellings fixed, the kind of reply prompt-lookup
    drafting (engine/spec/) is for. Real text through the model's chat
    template, so unlike the random prompts of ``build_workload`` the
    prompt's wording matters; outputs are ``shape``'s lengths, with
    ``ignore_eos``."""
    from tokenization.tokenizer import apply_chat_template

    rng = random.Random(seed)
    if passages is None:
        passages = edit_passages(EDIT_PASSAGES)
    offline = []
    for i in range(shape.num_requests):
        message = EDIT_INSTRUCTION + misspell(passages[i % len(passages)], rng)
        offline.append(
            OfflineRequest(
                request_id=f"edit-{i}",
                prompt_token_ids=apply_chat_template(
                    tokenizer, [{"role": "user", "content": message}]
                ),
                max_tokens=rng.randint(shape.out_min, shape.out_max),
            )
        )
    return Workload(seed=seed, vocab_size=vocab_size, offline=offline)


def misspell(text: str, rng: random.Random, every: int = 25) -> str:
    """``text`` with two letters swapped in about one word in ``every``."""
    words = text.split(" ")
    for i in range(rng.randrange(every), len(words), every):
        word = words[i]
        if len(word) >= 5 and word.isalpha():
            j = rng.randrange(1, len(word) - 2)
            words[i] = word[:j] + word[j + 1] + word[j] + word[j + 2 :]
    return " ".join(words)
