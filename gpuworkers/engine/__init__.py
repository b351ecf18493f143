"""The inference engine: paged KV cache, prefix cache, continuous batching.

A library with no Django import, usable offline like vLLM's LLM class::

    from gpuworkers.engine import LLMEngine, SamplingParams
    engine = LLMEngine.from_pretrained(model_dir)  # dtype "auto"
    outputs = engine.generate(["Hello"], SamplingParams(max_tokens=32))
"""

from gpuworkers.engine.config import AdmissionPolicy, EngineConfig, SchedulingPolicyName
from gpuworkers.engine.engine import LLMEngine
from gpuworkers.engine.outputs import (
    ChoiceDelta,
    CompletionChoice,
    GenerateOutput,
    RequestOutput,
    TokenLogprob,
)
from gpuworkers.engine.sampling_params import InvalidSamplingParams, SamplingParams
from gpuworkers.engine.sequence import ServiceClass

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
    "ServiceClass",
    "TokenLogprob",
]
