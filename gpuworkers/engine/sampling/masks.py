"""Sparse logit edits before penalties: bad words, min_tokens, logit_bias.

Each touches a handful of (row, token) cells, so the cells are listed in
Python (a pass over the rows that use them) and written with one
``index_put_`` each; no vocabulary-wide work.
"""

from __future__ import annotations

import torch

NEG_INF = float("-inf")


def needs_masks(sample) -> bool:
    params = sample.params
    return bool(
        params.logit_bias
        or sample.bad_words_ids
        or (sample.min_tokens_ids and sample.num_output_tokens < params.min_tokens)
    )


def apply_masks(scores: torch.Tensor, samples) -> None:
    """In place, in vLLM's order: bad words, min_tokens, then logit_bias
    (a bias never lifts a masked token: -inf plus anything stays -inf)."""
    rows: list[int] = []
    tokens: list[int] = []
    for i, sample in enumerate(samples):
        banned = banned_bad_words(sample)
        if sample.min_tokens_ids and sample.num_output_tokens < sample.params.min_tokens:
            banned.extend(sample.min_tokens_ids)
        rows.extend([i] * len(banned))
        tokens.extend(banned)
    device = scores.device
    if rows:
        index = (_long(rows, device), _long(tokens, device))
        scores.index_put_(index, torch.tensor(NEG_INF, device=device))
    rows, tokens, biases = [], [], []
    for i, sample in enumerate(samples):
        bias = sample.params.logit_bias
        rows.extend([i] * len(bias))
        tokens.extend(bias)
        biases.extend(bias.values())
    if rows:
        index = (_long(rows, device), _long(tokens, device))
        values = torch.tensor(biases, dtype=scores.dtype, device=device)
        scores.index_put_(index, values, accumulate=True)


def banned_bad_words(sample) -> list[int]:
    """Last tokens of the bad words whose other tokens end the output."""
    words = sample.bad_words_ids
    if not words:
        return []
    ids = sample.token_ids
    num_output = len(ids) - sample.num_prompt_tokens
    banned = []
    for word in words:
        prefix = len(word) - 1
        # The prefix must lie in the output: a prompt ending in it does not count.
        if prefix > num_output:
            continue
        if prefix == 0 or tuple(ids[len(ids) - prefix :]) == word[:-1]:
            banned.append(word[-1])
    return banned


def tokenize_bad_words(tokenizer, words: list[str]) -> tuple[tuple[int, ...], ...]:
    """Token sequences to forbid for each word, as vLLM builds them: the
    word as written, and with a leading space when that tokenizes to a
    different first token of the same length (the word mid-sentence)."""
    sequences: list[tuple[int, ...]] = []
    for word in words:
        bare = tuple(tokenizer.encode(word.lstrip(), add_special_tokens=False))
        spaced = tuple(tokenizer.encode(" " + word.lstrip(), add_special_tokens=False))
        if bare:
            sequences.append(bare)
        if spaced and (not bare or (spaced[0] != bare[0] and len(spaced) == len(bare))):
            sequences.append(spaced)
    return tuple(dict.fromkeys(sequences))


def _long(values: list[int], device) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.long, device=device)
