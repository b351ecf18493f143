"""Grammar-constrained decoding (structured output) with llguidance.

- ``spec.py``: the request's ``structured_output`` dict (plain JSON, as the
  wire carries it): its shapes, checks and the grammar each one means.
  Cheap and tokenizer-free, so the web tier validates with it too.
- ``compiler.py``: ``GrammarCompiler``, the engine's LRU of compiled
  grammars keyed by the spec's canonical JSON (one compile per schema).
- ``matcher.py``: ``GrammarState``, one choice's position in its grammar,
  and the batched bitmask fill the sampler applies.

Why llguidance (not xgrammar): ``bench/structured_output.py`` and
docs/benchmarks.md, "Structured output".
"""

from gpuworkers.engine.structured.compiler import CompiledGrammar, GrammarCompiler
from gpuworkers.engine.structured.matcher import GrammarState, allowed_tokens
from sampling_rules.structured import normalize

__all__ = ["CompiledGrammar", "GrammarCompiler", "GrammarState", "allowed_tokens", "normalize"]
