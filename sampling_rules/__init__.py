"""The rules of sampling that both sides of the wire obey.

One set of limits (``limits``), the error a broken rule raises and the
checks of a request's sampling settings, and the structured-output spec
(``structured``). Plain Python: the web tier checks a request against these
before anything is enqueued, the engine checks its ``SamplingParams``
against the same, and neither imports the other.
"""

from sampling_rules.checks import sampling_check, vocab_check
from sampling_rules.errors import InvalidSamplingParams, TokenIdOutOfVocabulary

__all__ = ["InvalidSamplingParams", "TokenIdOutOfVocabulary", "sampling_check", "vocab_check"]
