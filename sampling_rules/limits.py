"""Sampling limits that every worker accepts.

The web tier validates requests against these before anything is enqueued,
so a request that reaches a worker never fails on them. The engine checks
its own limits too (it is a library that runs without this package);
``tests/wire/test_limits.py`` keeps the two in step.
"""

# Most choices (``n``) per request.
MAX_N = 8
# Most stop strings per request, and the longest one in characters.
MAX_STOP_STRINGS = 4
MAX_STOP_STRING_CHARS = 256
# Most alternatives per token in ``top_logprobs``.
MAX_TOP_LOGPROBS = 20
# Most entries in ``logit_bias`` (OpenAI's limit), each bias in [-100, 100].
MAX_LOGIT_BIAS = 300
LOGIT_BIAS_RANGE = 100.0
# Most ``stop_token_ids`` and ``bad_words`` entries (vLLM extras).
MAX_STOP_TOKEN_IDS = 16
MAX_BAD_WORDS = 16
MAX_BAD_WORD_CHARS = 256
# Most alternatives per prompt token in ``prompt_logprobs``.
MAX_PROMPT_LOGPROBS = 20
