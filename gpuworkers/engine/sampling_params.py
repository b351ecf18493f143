"""Per-request sampling settings, validated once on construction.

The semantics follow vLLM's ``SamplingParams``; the order in which the
sampler applies them is in ``gpuworkers/engine/sampling/sampler.py``. The
limits and checks are ``sampling_rules``' (the web tier applies the same
ones before a request is enqueued); ``InvalidSamplingParams`` is theirs too.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sampling_rules import InvalidSamplingParams, sampling_check, vocab_check

__all__ = ["GREEDY_BELOW", "InvalidSamplingParams", "SamplingParams"]

# Temperatures under this sample greedily (vLLM's _SAMPLING_EPS).
GREEDY_BELOW = 1e-5


@dataclass(slots=True)
class SamplingParams:
    """How to sample one request.

    temperature 0 means greedy (the argmax after logit bias, masks and
    penalties). ``seed`` makes the draws of this request reproducible on
    their own: each choice has its own counter-based random stream, so the
    same seed and the same logits give the same tokens whatever else
    shares the batch (see ``sampling/rng.py`` for the exact promise).
    """

    max_tokens: int = 16
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 or -1: off
    min_p: float = 0.0  # 0: off; else keep tokens with p >= min_p * max p
    seed: int | None = None
    n: int = 1
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    include_stop_str_in_output: bool = False
    ignore_eos: bool = False
    # EOS, stop_token_ids and stop strings are held off until this many
    # output tokens exist.
    min_tokens: int = 0
    # Over output tokens, OpenAI style: subtract presence_penalty once and
    # frequency_penalty per occurrence from a token's logit.
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    # Over prompt and output tokens, CTRL style: positive logits of seen
    # tokens are divided by it, negative ones multiplied.
    repetition_penalty: float = 1.0
    # {token id: bias added to its logit}; ids are checked against the
    # model's vocabulary when the request reaches the engine.
    logit_bias: dict[int, float] = field(default_factory=dict)
    # Words never generated: the last token of each word's tokenization is
    # masked wherever the output ends with the tokens before it.
    bad_words: list[str] = field(default_factory=list)
    skip_special_tokens: bool = True
    logprobs: bool = False
    top_logprobs: int = 0
    # Log-probability of every prompt token (the first has none) and this
    # many alternatives each; None: off.
    prompt_logprobs: int | None = None
    # Batch-invariant steps for this request: the same tokens and logprobs,
    # bit for bit, whatever the prefix cache, chunking and batch (docs/engine.md,
    # "Determinism"); every step it shares runs slower.
    deterministic: bool = False
    # Grammar-constrained output, plain JSON as the wire carries it:
    # {"type": "json_object"} | {"type": "json_schema", "schema": {...},
    # "strict": bool} | {"type": "regex", "pattern": ...} | {"type":
    # "grammar", "grammar": <Lark>} (sampling_rules/structured.py).
    structured_output: dict | None = None

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        self.stop = list(self.stop or [])
        self.stop_token_ids = list(self.stop_token_ids or [])
        self.bad_words = list(self.bad_words or [])
        # JSON objects have string keys: {"198": -100} arrives as such.
        self.logit_bias = {_token_id(k): _bias(v) for k, v in (self.logit_bias or {}).items()}
        if self.top_k == -1:
            self.top_k = 0  # vLLM and OpenAI clients spell "off" as -1
        self.structured_output = sampling_check(self)

    def check_vocab(self, vocab_size: int) -> None:
        """Token ids in the request must exist in the model (the engine
        calls this; the web tier checks them too, against its tokenizer)."""
        vocab_check(self, vocab_size)

    @property
    def greedy(self) -> bool:
        # Below this, dividing logits by the temperature only overflows.
        return self.temperature < GREEDY_BELOW

    @property
    def uses_penalties(self) -> bool:
        return bool(
            self.presence_penalty or self.frequency_penalty or self.repetition_penalty != 1.0
        )

    @property
    def truncates(self) -> bool:
        """top_k, top_p or min_p cut the distribution (moot when greedy)."""
        return bool(self.top_k or self.top_p < 1.0 or self.min_p)


def _token_id(key) -> int:
    try:
        return int(key)
    except (TypeError, ValueError):
        raise InvalidSamplingParams("logit_bias", "logit_bias keys must be token ids") from None


def _bias(value) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        raise InvalidSamplingParams("logit_bias", "logit_bias values must be numbers") from None
