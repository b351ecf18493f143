"""top-k, min-p and top-p as one probability cut per row, and the draw.

Each row keeps the tokens whose probability is at least its cut: top-k's
k-th largest, min-p's min_p times the largest, top-p's smallest nucleus
member (the nucleus taken over what top-k and min-p keep, renormalised,
as vLLM orders them). So a row's kept set never depends on how ties are
ordered: every token tied with a cut is kept.

The cuts come from the top candidates of each row (``probs.topk``: 256,
or more for a larger top_k): top-p looks for its nucleus among them, then
among the top 1024 and 4096, then in a full sort, each row climbing only
as far as its own nucleus needs. When a row's kept set lies within its candidates (their
smallest is below the cut), the row draws from the candidates alone, in
vocabulary order: the float64 partial sums are then exactly those of the
full-vocabulary CDF (the dropped tokens add 0.0), so the token is the same
as ``invert_cdf`` on the masked row would give, without touching the
vocabulary again. Other rows are masked and drawn in full.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

# How many candidates a row takes: the first of these above its top_k. A
# row's count depends on its own top_k only, so its cut and its draw do
# not depend on the other rows (a batch with several counts runs one
# top-k per count).
CANDIDATE_COUNTS = (256, 1024, 4096)


@dataclass(slots=True)
class Cuts:
    cut: torch.Tensor  # [rows]: keep probs >= cut
    values: torch.Tensor  # [rows, K]: the K largest probs, descending
    indices: torch.Tensor  # [rows, K]: their token ids


def truncate(probs: torch.Tensor, params: list) -> None:
    """Zero, in place, what top-k, min-p and top-p drop from each row."""
    for index, group, count in _groups(params, probs.shape[-1], probs.device):
        rows = probs if index is None else probs[index]
        cuts = find_cuts(rows, group, count)
        rows.masked_fill_(rows < cuts.cut.unsqueeze(1), 0.0)
        if index is not None:
            probs[index] = rows


def draw(probs: torch.Tensor, params: list, u: torch.Tensor) -> torch.Tensor:
    """Per row, the token ``invert_cdf`` would draw at ``u`` from the row
    truncated as ``truncate`` does (cheaply when the candidates suffice)."""
    tokens = torch.empty(probs.shape[0], dtype=torch.long, device=probs.device)
    for index, group, count in _groups(params, probs.shape[-1], probs.device):
        if index is None:
            return _draw(probs, group, u, count)
        tokens[index] = _draw(probs[index], group, u[index], count)
    return tokens


def _draw(probs: torch.Tensor, params: list, u: torch.Tensor, count: int) -> torch.Tensor:
    cuts = find_cuts(probs, params, count)
    complete = cuts.values[:, -1] < cuts.cut
    tokens = torch.empty(probs.shape[0], dtype=torch.long, device=probs.device)
    if bool(complete.any()):
        rows = complete.nonzero().squeeze(1)
        values, indices, cut = cuts.values[rows], cuts.indices[rows], cuts.cut[rows]
        kept = values >= cut.unsqueeze(1)
        # Kept candidates in vocabulary order (dropped ones last, weight 0).
        ids, order = torch.where(kept, indices, probs.shape[-1]).sort(dim=-1)
        weights = torch.where(kept, values, 0.0).gather(1, order)
        tokens[rows] = ids.gather(1, invert_cdf(weights, u[rows]).unsqueeze(1)).squeeze(1)
    if not bool(complete.all()):
        rows = (~complete).nonzero().squeeze(1)
        dense = probs[rows]
        dense.masked_fill_(dense < cuts.cut[rows].unsqueeze(1), 0.0)
        tokens[rows] = invert_cdf(dense, u[rows])
    return tokens


def _groups(params: list, vocab: int, device):
    """(row index or None for all rows, their params, candidate count)."""
    counts = [_candidates(p.top_k, vocab) for p in params]
    if len(set(counts)) == 1:
        return [(None, params, counts[0])]
    groups = []
    for count in sorted(set(counts)):
        rows = [i for i, c in enumerate(counts) if c == count]
        groups.append((torch.tensor(rows, device=device), [params[i] for i in rows], count))
    return groups


def _candidates(top_k: int, vocab: int) -> int:
    # top_k + 1 at least: one past the k-th tells a complete set from one
    # cut short by ties.
    count = next((c for c in CANDIDATE_COUNTS if c > top_k), vocab)
    return min(count, vocab)


def invert_cdf(probs: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Per row, the first token whose cumulative mass exceeds ``u`` times
    the row's total: token i with probability p_i / total. Zero-probability
    tokens are never chosen (their CDF step is flat)."""
    cdf = probs.to(torch.float64).cumsum_(-1)
    total = cdf[:, -1:].contiguous()
    tokens = torch.searchsorted(cdf, u.unsqueeze(1) * total, right=True)
    # u < 1, but u * total may round up to total: take the last token with
    # any mass (the first index at which the CDF reaches the total).
    last = torch.searchsorted(cdf, total)
    return torch.minimum(tokens, last).squeeze(1)


def find_cuts(probs: torch.Tensor, params: list, count: int) -> Cuts:
    """Each row's cut, and its ``count`` top candidates."""
    rows, vocab = probs.shape
    device = probs.device
    ks = [p.top_k if 0 < p.top_k < vocab else 0 for p in params]
    values, indices = probs.topk(count, dim=-1)
    cut = torch.zeros(rows, dtype=probs.dtype, device=device)
    if any(ks):
        pick = torch.tensor([max(k, 1) - 1 for k in ks], device=device).unsqueeze(1)
        kth = values.gather(1, pick).squeeze(1)
        cut = torch.where(torch.tensor(ks, device=device) > 0, kth, cut)
    min_ps = [p.min_p for p in params]
    if any(min_ps):
        cut = torch.maximum(cut, values[:, 0] * _vector(min_ps, values.dtype, device))
    wanted = [i for i, p in enumerate(params) if p.top_p < 1.0]
    if wanted:
        index = torch.tensor(wanted, device=device)
        top_ps = torch.tensor([params[i].top_p for i in wanted], dtype=torch.float64, device=device)
        found = _top_p_cut(probs[index], values[index], cut[index], top_ps)
        cut[index] = torch.maximum(cut[index], found)
    return Cuts(cut, values, indices)


def _top_p_cut(probs, values, cut, top_ps: torch.Tensor) -> torch.Tensor:
    """The nucleus cut of each row over what ``cut`` keeps: kept tokens,
    most likely first, until the mass before them reaches top_p times the
    kept mass."""
    vocab = probs.shape[-1]
    # The kept mass, summed in float64 by per-row scans (a plain sum may
    # split a lone row across threads and round differently): 1 when
    # nothing is cut yet, else over the candidates if they hold every kept
    # token, else over the masked row.
    total = torch.ones_like(top_ps)
    cut_rows = cut > 0
    if bool(cut_rows.any()):
        kept = torch.where(values >= cut.unsqueeze(1), values, 0.0)
        total = torch.where(cut_rows, kept.to(torch.float64).cumsum_(-1)[:, -1], total)
        partial = (cut_rows & (values[:, -1] >= cut)).nonzero().squeeze(1)
        if len(partial):
            dense = probs[partial]
            dense.masked_fill_(dense < cut[partial].unsqueeze(1), 0.0)
            total[partial] = dense.to(torch.float64).cumsum_(-1)[:, -1]
    budget = total * top_ps
    found = nucleus_cut(torch.where(values >= cut.unsqueeze(1), values, 0.0), budget)
    pending = (found < 0).nonzero().squeeze(1)
    wider_counts = (c for c in CANDIDATE_COUNTS if values.shape[-1] < c < vocab)
    for k in (*wider_counts, vocab):
        if not len(pending):
            break
        wider = probs[pending]
        wider.masked_fill_(wider < cut[pending].unsqueeze(1), 0.0)
        if k < vocab:
            wider = wider.topk(k, dim=-1).values
        else:  # the same values; a sort is much cheaper than topk(all)
            wider = wider.sort(dim=-1, descending=True).values
        found[pending] = nucleus_cut(wider, budget[pending], last=k == vocab)
        pending = pending[found[pending] < 0]
    return found


def nucleus_cut(values: torch.Tensor, budget: torch.Tensor, last: bool = False) -> torch.Tensor:
    """Per row of descending ``values``: the smallest value kept while the
    mass before it is under ``budget``; -1 where the nucleus may extend
    past these values (all kept and the last one non-zero), unless
    ``last`` (they are the whole row)."""
    mass = values.to(torch.float64).cumsum_(-1)
    kept = ((mass - values) < budget.unsqueeze(1)).sum(-1)
    cut = values.gather(1, (kept.clamp(min=1) - 1).unsqueeze(1)).squeeze(1)
    if last:
        return cut
    unsettled = (kept == values.shape[-1]) & (values[:, -1] > 0)
    return torch.where(unsettled, -1.0, cut)


def _vector(values: list[float], dtype, device) -> torch.Tensor:
    return torch.tensor(values, dtype=dtype, device=device)
