"""Sampling: logits to tokens for the whole batch in one tensor program.

- ``sampler.py``: ``sample()``, the pipeline and its reproducibility promise.
- ``masks.py``: bad words, min_tokens, logit_bias (sparse edits).
- ``penalties.py``: repetition, frequency, presence (batched token counts).
- ``truncation.py``: top-k, min-p, top-p as per-row probability cuts.
- ``rng.py``: counter-based uniforms, one per (seed, draw index).
- ``logprobs.py``: sampled-token and prompt-token log-probabilities.
"""

from gpuworkers.engine.sampling.logprobs import prompt_logprobs
from gpuworkers.engine.sampling.masks import tokenize_bad_words
from gpuworkers.engine.sampling.request import prepare_request
from gpuworkers.engine.sampling.results import SampleResult, StepOutput
from gpuworkers.engine.sampling.rng import choice_seed
from gpuworkers.engine.sampling.sampler import sample

__all__ = [
    "SampleResult",
    "StepOutput",
    "choice_seed",
    "prepare_request",
    "prompt_logprobs",
    "sample",
    "tokenize_bad_words",
]
