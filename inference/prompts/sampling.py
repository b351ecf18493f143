"""A request's sampling settings, checked against the model before dispatch.

Every surface maps its schema onto the wire's ``Sampling``
(``inference.api.chat.sampling_of``); here the bounded record is checked
with the rules the engine applies (``sampling_rules``) and what only the
model can judge (token ids against its vocabulary), so a request that
reaches a worker never fails on its sampling settings. A broken rule is a
400 naming the API's parameter.
"""

from __future__ import annotations

from inference.errors import InvalidRequest
from sampling_rules import InvalidSamplingParams, TokenIdOutOfVocabulary
from wire.sampling import Sampling


def sampling_checked(sampling: Sampling, *, vocab_size: int, constraint_param: str) -> Sampling:
    """``sampling`` checked, its structured output normalized.

    ``constraint_param`` is the API's name for what constrains the output
    (``response_format``, or ``tool_choice`` for "required" and named
    functions). The grammar is checked here, by the grammar compiler's own
    validation (about a millisecond, no tokenizer), so a bad schema is a 400
    before admission, not a failed stream. Raises InvalidRequest naming the
    parameter when a value is out of range for this model or contradicts
    another.
    """
    max_tokens = sampling.max_tokens
    if max_tokens is not None and sampling.min_tokens > max_tokens:
        raise InvalidRequest(
            f"min_tokens ({sampling.min_tokens}) must be at most max_tokens ({max_tokens}).",
            param="min_tokens",
        )
    try:
        return sampling.checked(vocab_size=vocab_size)
    except InvalidSamplingParams as exc:
        # The API's name for what the engine calls structured_output.
        param = constraint_param if exc.param == "structured_output" else exc.param
        message = str(exc).replace("structured_output", param, 1)
        code = "invalid_value" if isinstance(exc, TokenIdOutOfVocabulary) else None
        raise InvalidRequest(message, param=param, code=code) from exc
