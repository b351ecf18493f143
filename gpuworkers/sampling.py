"""The engine's ``SamplingParams`` from the wire's ``Sampling``: the one way
sampling settings enter the engine from the bus (the engine imports no wire).

The two records have the same fields (``tests/gpuworkers/test_sampling.py``
keeps them so); ``SamplingParams`` checks them again with the same
``sampling_rules`` the web tier applied, as the engine's last word.
"""

from __future__ import annotations

from dataclasses import fields

from gpuworkers.engine.sampling_params import SamplingParams
from wire.sampling import Sampling

FIELDS = tuple(f.name for f in fields(Sampling))


def sampling_params(sampling: Sampling) -> SamplingParams:
    """Raises InvalidSamplingParams (a ValueError) naming a field out of range."""
    values = {name: getattr(sampling, name) for name in FIELDS}
    values["logit_bias"] = dict(sampling.logit_bias)
    return SamplingParams(**values)
