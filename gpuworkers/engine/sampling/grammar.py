"""Structured output in the sampler: tokens the grammar forbids get -inf.

Applied first, before bad words, logit_bias and penalties (as vLLM
applies its grammar bitmask before the sampler): -inf survives every later
step, so the draw and the greedy argmax only ever see allowed tokens.
"""

from __future__ import annotations

import torch

from gpuworkers.engine.structured import allowed_tokens

NEG_INF = float("-inf")


def needs_grammar(samples) -> bool:
    return any(s.grammar is not None for s in samples)


def apply_grammars(scores: torch.Tensor, samples) -> torch.Tensor:
    """``scores`` with each constrained row masked, as one ``torch.where``
    over those rows (the unconstrained rows are not touched).

    On CPU (torch 2.13) a ``where`` on [64, 49152] took about half the time
    of ``masked_fill_`` with the same mask.
    """
    rows = [i for i, s in enumerate(samples) if s.grammar is not None]
    allowed = allowed_tokens([samples[i].grammar for i in rows], scores.shape[1])
    allowed = allowed.to(scores.device, non_blocking=True)
    if len(rows) == scores.shape[0]:
        return torch.where(allowed, scores, NEG_INF)
    index = torch.tensor(rows, device=scores.device)
    scores[index] = torch.where(allowed, scores[index], NEG_INF)
    return scores
