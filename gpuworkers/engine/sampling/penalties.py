"""Repetition, frequency and presence penalties, batched over the rows that
use them.

Built on the logits' device each step from the rows' token ids (one
padded id tensor per step; output counts by ``scatter_add_`` into [rows,
vocab + 1], the extra column swallowing the padding). Rows without
penalties cost nothing; a batch without any skips this module entirely.
"""

from __future__ import annotations

import torch


def apply_penalties(scores: torch.Tensor, samples) -> None:
    """In place, in vLLM's order: repetition (prompt and output tokens),
    then frequency and presence (output tokens only).

    Only the cells of tokens a row has seen change, so the work is a
    gather, a few ops on [rows, seen] and a scatter back; the one
    vocabulary-sized tensor is the output counts.
    """
    # A row with no tokens (none given) has seen nothing to penalise.
    picked = [i for i, s in enumerate(samples) if s.params.uses_penalties and s.token_ids]
    if not picked:
        return
    device = scores.device
    chosen = [samples[i] for i in picked]
    outputs = [s.token_ids[s.num_prompt_tokens :] for s in chosen]
    counts = token_counts(outputs, scores.shape[-1], device, scores.dtype)
    # Every token the row has seen (prompt and output), padded with its
    # first: a padded cell is computed and written like the real one.
    longest = max(len(s.token_ids) for s in chosen)
    seen = torch.tensor(
        [s.token_ids + [s.token_ids[0]] * (longest - len(s.token_ids)) for s in chosen],
        dtype=torch.long,
        device=device,
    )
    rows = torch.tensor(picked, dtype=torch.long, device=device).unsqueeze(1)
    values = scores[rows, seen]
    seen_counts = counts.gather(1, seen)
    params = [s.params for s in chosen]
    if any(p.repetition_penalty != 1.0 for p in params):
        penalty = _column([p.repetition_penalty for p in params], scores)
        # Dividing positive logits and multiplying negative ones both make
        # a seen token less likely (CTRL, as vLLM and HF do it).
        values = torch.where(values > 0, values / penalty, values * penalty)
    # A prompt-only token has count 0: both terms subtract exactly 0.
    if any(p.frequency_penalty for p in params):
        values = values - _column([p.frequency_penalty for p in params], scores) * seen_counts
    if any(p.presence_penalty for p in params):
        present = (seen_counts > 0).to(scores.dtype)
        values = values - _column([p.presence_penalty for p in params], scores) * present
    scores[rows, seen] = values


def token_counts(
    id_lists: list[list[int]], vocab: int, device, dtype=torch.float32
) -> torch.Tensor:
    """[len(id_lists), vocab]: how often each token occurs in each list."""
    longest = max((len(ids) for ids in id_lists), default=0)
    counts = torch.zeros(len(id_lists), vocab + 1, dtype=dtype, device=device)
    if longest:
        padded = [ids + [vocab] * (longest - len(ids)) for ids in id_lists]
        ids = torch.tensor(padded, dtype=torch.long, device=device)
        counts.scatter_add_(1, ids, torch.ones(ids.shape, dtype=dtype, device=device))
    return counts[:, :vocab]


def _column(values: list[float], like: torch.Tensor) -> torch.Tensor:
    return torch.tensor(values, dtype=like.dtype, device=like.device).unsqueeze(1)
