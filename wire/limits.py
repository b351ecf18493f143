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
