"""Per-request sampling settings, validated once on construction.

The semantics follow vLLM's ``SamplingParams``; the order in which the
sampler applies them is in ``gpuworkers/engine/sampling/sampler.py``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

MAX_TOP_LOGPROBS = 20
MAX_STOP_STRINGS = 4
MAX_N = 8
# Most entries in ``logit_bias`` (OpenAI's documented cap), and the most
# ``bad_words`` (each costs a tokenization per request and a suffix match
# per step).
MAX_LOGIT_BIAS = 300
MAX_BAD_WORDS = 64
MAX_BAD_WORD_CHARS = 256
# Temperatures under this sample greedily (vLLM's _SAMPLING_EPS).
GREEDY_BELOW = 1e-5


class InvalidSamplingParams(ValueError):
    """A sampling setting out of range; ``param`` names the offending field."""

    def __init__(self, param: str, message: str):
        super().__init__(message)
        self.param = param


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
    # bit for bit, whatever the prefix cache, chunking and batch (README,
    # "Determinism"); every step it shares runs slower.
    deterministic: bool = False
    # Grammar-constrained output, plain JSON as the wire carries it:
    # {"type": "json_object"} | {"type": "json_schema", "schema": {...},
    # "strict": bool} | {"type": "regex", "pattern": ...} | {"type":
    # "grammar", "grammar": <Lark>} (engine/structured/spec.py).
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
        self._check_ranges()
        self._check_lists()
        if self.structured_output is not None:
            # Imported here: structured.spec raises InvalidSamplingParams.
            from sampling_rules.structured import normalize

            self.structured_output = normalize(self.structured_output)
        if not 0 <= self.top_logprobs <= MAX_TOP_LOGPROBS:
            raise InvalidSamplingParams(
                "top_logprobs", f"top_logprobs must be between 0 and {MAX_TOP_LOGPROBS}"
            )
        if self.top_logprobs and not self.logprobs:
            raise InvalidSamplingParams("top_logprobs", "top_logprobs requires logprobs=true")
        if self.prompt_logprobs is not None and not 0 <= self.prompt_logprobs <= MAX_TOP_LOGPROBS:
            raise InvalidSamplingParams(
                "prompt_logprobs", f"prompt_logprobs must be between 0 and {MAX_TOP_LOGPROBS}"
            )

    def _check_ranges(self) -> None:
        if not isinstance(self.max_tokens, int) or self.max_tokens < 1:
            raise InvalidSamplingParams("max_tokens", "max_tokens must be an integer >= 1")
        if not 0.0 <= self.temperature <= 2.0:
            raise InvalidSamplingParams("temperature", "temperature must be between 0 and 2")
        if not 0.0 < self.top_p <= 1.0:
            raise InvalidSamplingParams("top_p", "top_p must be in (0, 1]")
        if self.top_k < 0:
            raise InvalidSamplingParams("top_k", "top_k must be >= 0 (0 or -1 disables it)")
        if not 0.0 <= self.min_p <= 1.0:
            raise InvalidSamplingParams("min_p", "min_p must be between 0 and 1")
        if not 1 <= self.n <= MAX_N:
            raise InvalidSamplingParams("n", f"n must be between 1 and {MAX_N}")
        if not isinstance(self.min_tokens, int) or not 0 <= self.min_tokens <= self.max_tokens:
            raise InvalidSamplingParams(
                "min_tokens", "min_tokens must be an integer between 0 and max_tokens"
            )
        for name in ("presence_penalty", "frequency_penalty"):
            if not -2.0 <= getattr(self, name) <= 2.0:
                raise InvalidSamplingParams(name, f"{name} must be between -2 and 2")
        if not self.repetition_penalty > 0.0:
            raise InvalidSamplingParams("repetition_penalty", "repetition_penalty must be > 0")

    def _check_lists(self) -> None:
        if len(self.stop) > MAX_STOP_STRINGS:
            raise InvalidSamplingParams("stop", f"at most {MAX_STOP_STRINGS} stop sequences")
        if any(not s for s in self.stop):
            raise InvalidSamplingParams("stop", "stop sequences must be non-empty strings")
        if any(not isinstance(t, int) or t < 0 for t in self.stop_token_ids):
            raise InvalidSamplingParams("stop_token_ids", "stop_token_ids must be token ids >= 0")
        if len(self.logit_bias) > MAX_LOGIT_BIAS:
            raise InvalidSamplingParams(
                "logit_bias", f"at most {MAX_LOGIT_BIAS} logit_bias entries"
            )
        if any(t < 0 for t in self.logit_bias):
            raise InvalidSamplingParams("logit_bias", "logit_bias keys must be token ids >= 0")
        if any(not -100.0 <= b <= 100.0 for b in self.logit_bias.values()):
            raise InvalidSamplingParams(
                "logit_bias", "logit_bias values must be between -100 and 100"
            )
        if len(self.bad_words) > MAX_BAD_WORDS:
            raise InvalidSamplingParams("bad_words", f"at most {MAX_BAD_WORDS} bad_words")
        if any(not isinstance(w, str) or not w.strip() for w in self.bad_words):
            raise InvalidSamplingParams("bad_words", "bad_words must be non-empty strings")
        if any(len(w) > MAX_BAD_WORD_CHARS for w in self.bad_words):
            raise InvalidSamplingParams(
                "bad_words", f"bad_words may be at most {MAX_BAD_WORD_CHARS} characters"
            )

    def check_vocab(self, vocab_size: int) -> None:
        """Token ids in the request must exist in the model (the engine
        calls this; the web tier cannot know every model's vocabulary)."""
        for name, ids in (("logit_bias", self.logit_bias), ("stop_token_ids", self.stop_token_ids)):
            outside = sorted(t for t in ids if t >= vocab_size)
            if outside:
                raise InvalidSamplingParams(
                    name,
                    f"{name} has token id {outside[0]}, outside the model's vocabulary "
                    f"(ids 0..{vocab_size - 1})",
                )

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
