"""Compiled grammars, once per distinct spec: an LRU keyed by canonical JSON.

Compiling a JSON schema with llguidance takes about a millisecond (its
lexer is built lazily, per token prefix, as matchers walk it; figures in
``bench/results/structured-output.json``), so the engine compiles on its
own thread when a request arrives rather than on a helper thread. The
costly part, the tokenizer's byte trie (about a second for 49k tokens),
is built once per engine, at warm-up.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from functools import lru_cache

from gpuworkers.engine.structured.matcher import GrammarState
from sampling_rules.structured import canonical_key, check, grammar_for, normalize

DEFAULT_CAPACITY = 128


@dataclass(slots=True)
class CompiledGrammar:
    """One spec's grammar, and a matcher at its start to copy per choice
    (a copy costs ~10 us, a new matcher ~0.4 ms)."""

    key: str
    template: object  # llguidance.LLMatcher, never advanced

    def new_state(self) -> GrammarState:
        return GrammarState(self.template.deep_copy())


class GrammarCompiler:
    """Compiles ``structured_output`` specs against one model's tokenizer.

    Args:
        tokenizer: the model's Hugging Face fast tokenizer.
        vocab_size: the model's logits width (may exceed the tokenizer's).
        eos_token_ids: ids that may end the output once the grammar is complete.
        capacity: compiled grammars kept; the least recently used go first.
    """

    def __init__(
        self, tokenizer, vocab_size: int, eos_token_ids: list[int], capacity: int = DEFAULT_CAPACITY
    ):
        self.hf_tokenizer = tokenizer
        self.vocab_size = vocab_size
        self.eos_token_ids = list(eos_token_ids)
        self.capacity = capacity
        self._tokenizer = None
        self._cache: OrderedDict[str, CompiledGrammar] = OrderedDict()
        self.hits = 0
        self.misses = 0

    def prepare(self) -> None:
        """Build the tokenizer's trie now (warm-up), not on the first request."""
        self._llg_tokenizer()

    def compile(self, spec: dict) -> CompiledGrammar:
        """The compiled grammar of a ``structured_output`` spec, cached.

        Raises:
            InvalidSamplingParams: (param ``structured_output``) the spec or
                its grammar is invalid for this model.
        """
        spec = normalize(spec)
        key = canonical_key(spec)
        found = self._cache.get(key)
        if found is not None:
            self._cache.move_to_end(key)
            self.hits += 1
            return found
        self.misses += 1
        from llguidance import LLMatcher

        tokenizer = self._llg_tokenizer()
        grammar = grammar_for(spec)
        # Again with the tokenizer: a grammar may name tokens ("<|im_end|>")
        # only this model has.
        check(grammar, tokenizer)
        compiled = CompiledGrammar(key, LLMatcher(tokenizer, grammar, log_level=0))
        self._cache[key] = compiled
        if len(self._cache) > self.capacity:
            self._cache.popitem(last=False)
        return compiled

    def __len__(self) -> int:
        return len(self._cache)

    def _llg_tokenizer(self):
        if self._tokenizer is None:
            eos = tuple(self.eos_token_ids)
            self._tokenizer = _llg_tokenizer(self.hf_tokenizer, self.vocab_size, eos)
        return self._tokenizer


# Per process, not per engine: engines over one model (tests, benchmarks)
# share the tokenizer object, and the trie is immutable.
@lru_cache(maxsize=4)
def _llg_tokenizer(hf_tokenizer, vocab_size: int, eos_token_ids: tuple[int, ...]):
    import llguidance.hf

    return llguidance.hf.from_tokenizer(
        hf_tokenizer, n_vocab=vocab_size, eos_token=list(eos_token_ids)
    )
