"""The sampling limits: defined here once, read by the web tier and the engine.

The web tier's schemas bound each field with these (so a 400 names the
parameter before anything is enqueued) and ``sampling_rules.checks`` applies
them to every sampling record, on the web tier and again in the engine's
``SamplingParams``: a request that reaches a worker never fails on them.
"""

# Most choices (``n``) per request.
MAX_N = 8
# Temperature in [0, MAX_TEMPERATURE]; 0 is greedy.
MAX_TEMPERATURE = 2.0
# presence_penalty and frequency_penalty in [-PENALTY_RANGE, PENALTY_RANGE].
PENALTY_RANGE = 2.0
# repetition_penalty in (0, MAX_REPETITION_PENALTY]; 1 is off.
MAX_REPETITION_PENALTY = 2.0
# Most stop strings per request, and the longest one in characters: each is
# matched against the output after every token.
MAX_STOP_STRINGS = 4
MAX_STOP_STRING_CHARS = 256
# Most alternatives per token in ``top_logprobs``.
MAX_TOP_LOGPROBS = 20
# Most entries in ``logit_bias`` (OpenAI's limit), each bias in [-100, 100].
MAX_LOGIT_BIAS = 300
LOGIT_BIAS_RANGE = 100.0
# Most ``stop_token_ids`` and ``bad_words`` entries (vLLM extras); each bad
# word costs a tokenization per request and a suffix match per step.
MAX_STOP_TOKEN_IDS = 16
MAX_BAD_WORDS = 16
MAX_BAD_WORD_CHARS = 256
# Most alternatives per prompt token in ``prompt_logprobs``.
MAX_PROMPT_LOGPROBS = 20
