"""Turn float32 logits into tokens: greedy, temperature, top-k, top-p, seeds.

Every sequence samples from its own ``torch.Generator``: the draw for a
row depends only on that row's logits and that sequence's generator, so a
seeded request gets the same tokens whatever else shares the batch.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import torch

from gpuworkers.engine.sampling_params import SamplingParams


@dataclass(slots=True)
class SampleRequest:
    row: int  # row of the logits tensor
    params: SamplingParams
    generator: torch.Generator | None


@dataclass(slots=True)
class SampleResult:
    token_id: int
    logprob: float | None = None
    # (token_id, logprob) of the most likely tokens, best first.
    top: list[tuple[int, float]] | None = None


def make_generator(seed: int | None, choice_index: int) -> torch.Generator:
    """A per-sequence generator; choice i of a seeded request gets its own stream."""
    generator = torch.Generator()
    if seed is None:
        generator.manual_seed(random.getrandbits(63))
    else:
        # Distinct, reproducible streams for the n choices of one seed.
        generator.manual_seed((seed * 1_000_003 + choice_index) % (2**63))
    return generator


def sample(logits: torch.Tensor, requests: list[SampleRequest]) -> list[SampleResult]:
    """One token per request; several requests may share a logits row (n > 1).

    ``requests`` may be anything with ``row``, ``params`` and ``generator``
    (the engine passes the batch's ``SampleInput`` entries).
    """
    logits = logits.float().cpu()
    results: list[SampleResult | None] = [None] * len(requests)
    greedy = [i for i, r in enumerate(requests) if r.params.greedy]
    if greedy:
        rows = [requests[i].row for i in greedy]
        if rows == list(range(logits.shape[0])):
            # Every row greedy, in order (the common case): no gathered copy.
            tokens = logits.argmax(dim=-1).tolist()
        else:
            tokens = logits.index_select(0, torch.tensor(rows)).argmax(dim=-1).tolist()
        for i, token in zip(greedy, tokens, strict=True):
            results[i] = SampleResult(token)
    for i, request in enumerate(requests):
        if results[i] is None:
            results[i] = SampleResult(_sample_row(logits[request.row], request))
    logprob_rows = {r.row for r in requests if r.params.logprobs}
    if logprob_rows:
        _attach_logprobs(logits, requests, results)
    return results  # type: ignore[return-value]


def _sample_row(row: torch.Tensor, request: SampleRequest) -> int:
    params = request.params
    scores = row / params.temperature
    if params.top_k and params.top_k < scores.shape[-1]:
        kth = torch.topk(scores, params.top_k).values[-1]
        scores = scores.masked_fill(scores < kth, float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    if params.top_p < 1.0:
        sorted_probs, order = probs.sort(descending=True)
        cumulative = sorted_probs.cumsum(-1)
        # Keep the smallest set whose mass reaches top_p (always >= 1 token).
        sorted_probs[(cumulative - sorted_probs) >= params.top_p] = 0.0
        choice = torch.multinomial(sorted_probs, 1, generator=request.generator)
        return int(order[choice])
    return int(torch.multinomial(probs, 1, generator=request.generator))


def _attach_logprobs(logits, requests: list[SampleRequest], results: list[SampleResult]) -> None:
    # Log-probabilities of the model's own distribution (before temperature
    # and truncation), as OpenAI reports them.
    rows = sorted({r.row for r in requests if r.params.logprobs})
    logprobs = torch.log_softmax(logits.index_select(0, torch.tensor(rows)), dim=-1)
    by_row = {row: i for i, row in enumerate(rows)}
    for request, result in zip(requests, results, strict=True):
        if not request.params.logprobs:
            continue
        row = logprobs[by_row[request.row]]
        result.logprob = float(row[result.token_id])
        k = request.params.top_logprobs
        if k:
            values, ids = torch.topk(row, k)
            result.top = list(zip(ids.tolist(), values.tolist(), strict=True))
        else:
            result.top = []
