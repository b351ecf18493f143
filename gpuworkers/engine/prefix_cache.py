"""Chained block hashes for the prefix cache.

A full block's hash covers its parent's hash, its token ids, the model id
and an optional cache salt (per tenant), so two blocks share a hash only if
everything before and in them is identical for the same model and tenant.
Only exact leading blocks can therefore match.

Deterministic requests hash into a space of their own. Their blocks are
computed by batch-invariant steps, whose K/V bits differ from the regular
kernels' for the same tokens; a deterministic request that hit a block of
the regular path would see other bits than when it computes the prefix
itself, which is exactly what the mode promises never happens. (A regular
request could use their blocks but never finds them: simpler, and costs
only sharing between the two kinds.)
"""

from __future__ import annotations

import hashlib
from array import array
from typing import NewType

BlockHash = NewType("BlockHash", bytes)


def hash_block(
    parent: BlockHash | None,
    token_ids: list[int],
    model_id: str,
    cache_salt: str | None,
    deterministic: bool = False,
) -> BlockHash:
    """Hash one full block given its parent block's hash."""
    digest = hashlib.sha256()
    digest.update(parent or b"root")
    digest.update(model_id.encode())
    # The salt and the deterministic marker only enter the first block; the
    # chain carries them onwards.
    if parent is None and cache_salt:
        digest.update(b"salt:" + cache_salt.encode())
    if parent is None and deterministic:
        digest.update(b"deterministic")
    digest.update(array("q", token_ids).tobytes())
    return BlockHash(digest.digest())


def hash_full_blocks(
    token_ids: list[int],
    block_size: int,
    model_id: str,
    cache_salt: str | None,
    known: list[BlockHash] | None = None,
    deterministic: bool = False,
) -> list[BlockHash]:
    """Hashes of every full block of ``token_ids``, extending ``known``."""
    hashes = list(known or [])
    for start in range(len(hashes) * block_size, len(token_ids) - block_size + 1, block_size):
        parent = hashes[-1] if hashes else None
        tokens = token_ids[start : start + block_size]
        hashes.append(hash_block(parent, tokens, model_id, cache_salt, deterministic))
    return hashes
