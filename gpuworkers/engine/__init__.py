"""The inference engine: paged KV cache, prefix cache, continuous batching.

A library with no Django import, usable offline like vLLM's LLM class::

    from gpuworkers.engine import LLMEngine, SamplingParams
    engine = LLMEngine.from_pretrained(model_dir, dtype="bfloat16")
    outputs = engine.generate(["Hello"], SamplingParams(max_tokens=32))
"""

import os

# OpenMP threads that wait at a barrier sleep instead of spinning, unless the
# caller chose otherwise. libgomp reads this once, when torch loads it, so it
# is set here, before this package's first torch import. Why: the engine
# shares its cores with the web tier, Redis and PostgreSQL (and other
# workers); spinning threads then take the core from the very thread they
# wait for. Measured on this 2-core machine with other work running
# (`python -m bench.ab_generate`, alternating): 1.8-3.2 s per batch with
# PASSIVE against 3.8-40.9 s with the default.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from gpuworkers.engine.config import (  # noqa: E402
    AdmissionPolicy,
    EngineConfig,
    SchedulingPolicyName,
)
from gpuworkers.engine.engine import LLMEngine  # noqa: E402
from gpuworkers.engine.outputs import (  # noqa: E402
    ChoiceDelta,
    CompletionChoice,
    GenerateOutput,
    RequestOutput,
    TokenLogprob,
)
from gpuworkers.engine.sampling_params import InvalidSamplingParams, SamplingParams  # noqa: E402

__all__ = [
    "AdmissionPolicy",
    "ChoiceDelta",
    "CompletionChoice",
    "EngineConfig",
    "GenerateOutput",
    "InvalidSamplingParams",
    "LLMEngine",
    "RequestOutput",
    "SamplingParams",
    "SchedulingPolicyName",
    "TokenLogprob",
]
