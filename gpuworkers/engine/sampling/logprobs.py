"""Log-probabilities of the model's own distribution (before temperature,
penalties and truncation), as OpenAI reports them: of sampled tokens, and
of prompt tokens (``prompt_logprobs``)."""

from __future__ import annotations

import torch

from gpuworkers.engine.sampling.results import SampleResult


def attach_logprobs(logits: torch.Tensor, samples, results: list[SampleResult]) -> None:
    """Fill ``logprob`` and ``top`` of the results whose sample asked."""
    wanted = [i for i, s in enumerate(samples) if s.params.logprobs]
    rows = sorted({samples[i].row for i in wanted})
    device = logits.device
    logprobs = torch.log_softmax(logits[torch.tensor(rows, device=device)], -1)
    by_row = {row: i for i, row in enumerate(rows)}
    picked = torch.tensor([by_row[samples[i].row] for i in wanted], device=device)
    tokens = torch.tensor([results[i].token_id for i in wanted], device=device)
    chosen = logprobs[picked, tokens].tolist()
    k = max(samples[i].params.top_logprobs for i in wanted)
    top_values = top_ids = None
    if k:
        top = torch.topk(logprobs, k, dim=-1)
        top_values, top_ids = top.values.tolist(), top.indices.tolist()
    for n, i in enumerate(wanted):
        result = results[i]
        result.logprob = chosen[n]
        own = samples[i].params.top_logprobs
        row = by_row[samples[i].row]
        result.top = (
            list(zip(top_ids[row][:own], top_values[row][:own], strict=True)) if own else []
        )


def prompt_logprobs(logits: torch.Tensor, items) -> dict[int, list[SampleResult]]:
    """Per prompt chunk, the logprob of each prompt token it predicts.

    Args:
        logits: the rows of every item's ``positions``, items in order.
        items: shaped like ``scheduling.batch.PromptLogprobsInput``:
            ``seq_id``, ``positions``, ``target_ids``, ``k``.
    """
    logprobs = torch.log_softmax(logits, dim=-1)
    device = logits.device
    targets = torch.tensor([t for item in items for t in item.target_ids], device=device)
    chosen = logprobs.gather(1, targets.unsqueeze(1)).squeeze(1).tolist()
    k = max(item.k for item in items)
    top_values = top_ids = None
    if k:
        top = torch.topk(logprobs, k, dim=-1)
        top_values, top_ids = top.values.tolist(), top.indices.tolist()
    out: dict[int, list[SampleResult]] = {}
    start = 0
    for item in items:
        entries = out.setdefault(item.seq_id, [])
        for row in range(start, start + len(item.target_ids)):
            top = (
                list(zip(top_ids[row][: item.k], top_values[row][: item.k], strict=True))
                if item.k
                else []
            )
            entries.append(SampleResult(item.target_ids[row - start], chosen[row], top))
        start += len(item.target_ids)
    return out
