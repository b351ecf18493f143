"""Each backend's metadata builder from the runner's common metadata: the
torch backend's index tensors (no query x key masks), FlashInfer's page
tables (no masks); the torch backend's tiled attention for chunks after
cached context. No model, no GPU: FlashInfer's wrappers are stood in for."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pytest
import torch

from gpuworkers.engine.attention import CommonAttentionMetadata, torch_backend
from gpuworkers.engine.attention.flashinfer_backend import (
    FlashInferMetadata,
    FlashInferMetadataBuilder,
)
from gpuworkers.engine.attention.torch_backend import TorchAttentionBackend

BLOCK = 4


def batch_layout() -> CommonAttentionMetadata:
    """Two decodes (contexts 5 and 0), then chunks of 3 (no context) and 2
    (after 6 cached tokens); tables cover context + query tokens."""
    return CommonAttentionMetadata(
        num_decodes=2,
        slot_mapping=torch.tensor([13, 36, 4, 5, 6, 18, 19]),
        query_lens=[1, 1, 3, 2],
        context_lens=[5, 0, 0, 6],
        block_tables=[[7, 3], [9], [1], [2, 4]],
    )


def test_torch_builder_pads_decode_tables_and_lays_out_chunks():
    backend = TorchAttentionBackend(4, 2, 64, BLOCK, use_kernel=False)
    common = batch_layout()
    meta = backend.metadata_builder.build(common, torch.float32)
    assert meta.decode_block_tables.tolist() == [[7, 3], [9, 0]]
    assert meta.decode_kv_lens.tolist() == [6, 1]
    spans = [(s.query_start, s.query_len, s.context_len) for s in meta.prefills]
    assert spans == [(2, 3, 0), (5, 2, 6)]
    assert meta.prefills[1].block_table.tolist() == [2, 4]
    assert not meta.deterministic and meta.decode_table_rows is None
    # Gather path: padded groups, and the K/V write's blocks and offsets.
    assert meta.decode_kernel is None and len(meta.decode_groups) == 1
    assert meta.slot_blocks.tolist() == [3, 9, 1, 1, 1, 4, 4]
    assert meta.slot_offsets.tolist() == [1, 0, 0, 1, 2, 2, 3]


def test_torch_builder_binds_the_decode_kernel_once_per_step():
    backend = TorchAttentionBackend(9, 3, 64, 16)
    if backend.kernel is None:
        pytest.skip("no compiled CPU kernels on this host")
    common = CommonAttentionMetadata(1, torch.tensor([5]), [1], [5], [[2]])
    meta = backend.metadata_builder.build(common, torch.float32)
    assert meta.decode_kernel is not None and not meta.decode_groups
    assert meta.slot_blocks is None, "the kernel writes K/V itself"


class RecordingWrapper:
    def __init__(self):
        self.plans = []

    def plan(self, *args, **kwargs):
        self.plans.append((args, kwargs))


def flashinfer_stand_in():
    return SimpleNamespace(
        num_heads=4,
        num_kv_heads=2,
        head_dim=64,
        block_size=BLOCK,
        decode_wrapper=RecordingWrapper(),
        prefill_wrapper=RecordingWrapper(),
    )


def ints(tensors):
    assert all(t.dtype == torch.int32 for t in tensors)
    return [t.tolist() for t in tensors]


def test_flashinfer_builder_plans_page_tables_and_builds_no_mask():
    backend = flashinfer_stand_in()
    meta = FlashInferMetadataBuilder(backend).build(batch_layout(), torch.bfloat16)
    ((args, kwargs),) = backend.decode_wrapper.plans
    # indptr, indices, last_page_len: 6 keys = 2 pages (2 in the last), 1 key.
    assert ints(args[:3]) == [[0, 2, 3], [7, 3, 9], [2, 1]]
    ((args, kwargs),) = backend.prefill_wrapper.plans
    # qo_indptr, then the pages of 3 keys and of 6 + 2 keys.
    assert ints(args[:4]) == [[0, 3, 5], [0, 1, 3], [1, 2, 4], [3, 4]]
    assert kwargs["causal"] is True
    assert (meta.num_decodes, meta.num_prefills) == (2, 2)
    assert set(FlashInferMetadata.__slots__) == {
        "num_decodes",
        "num_prefills",
        "slot_mapping",
        "deterministic",
    }


def test_flashinfer_builder_plans_only_the_wrappers_in_use():
    backend = flashinfer_stand_in()
    decodes_only = CommonAttentionMetadata(1, torch.tensor([5]), [1], [5], [[2, 8]])
    FlashInferMetadataBuilder(backend).build(decodes_only, torch.bfloat16)
    assert len(backend.decode_wrapper.plans) == 1 and not backend.prefill_wrapper.plans


def tensors_in(value) -> list[torch.Tensor]:
    """Every tensor a metadata object holds, through dataclasses and lists."""
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, list | tuple):
        return [t for item in value for t in tensors_in(item)]
    if dataclasses.is_dataclass(value):
        return [t for f in dataclasses.fields(value) for t in tensors_in(getattr(value, f.name))]
    return []


@pytest.mark.parametrize("use_kernel", [False, True])
def test_a_long_chunk_after_long_context_builds_no_query_by_key_mask(use_kernel):
    """Issue 14, bug 5: a 2k chunk on 32k cached tokens used to build a dense
    float32 [2048, 34816] mask (285 MB) in the metadata, once per step.
    The metadata now holds only per-token and per-block index tensors."""
    context, chunk = 32768, 2048
    backend = TorchAttentionBackend(9, 3, 64, 16, use_kernel=use_kernel)
    common = CommonAttentionMetadata(
        num_decodes=0,
        slot_mapping=torch.arange(context, context + chunk),
        query_lens=[chunk],
        context_lens=[context],
        block_tables=[list(range((context + chunk) // 16))],
    )
    meta = backend.metadata_builder.build(common, torch.bfloat16)
    held = sum(t.numel() * t.element_size() for t in tensors_in(meta))
    assert held < 100_000, f"{held} bytes of metadata for one chunk"


def dense_attention(q, k, v, query_positions):
    """Causal softmax attention in float32, one query at a time."""
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    rows = []
    for i, pos in enumerate(query_positions):
        scores = torch.einsum("hd,khd->hk", q[i], k[: pos + 1]) * q.shape[-1] ** -0.5
        rows.append(torch.einsum("hk,khd->hd", scores.softmax(-1), v[: pos + 1]))
    return torch.stack(rows)


def test_a_chunk_after_context_attends_in_query_tiles_with_small_masks(monkeypatch):
    """Three tiles of at most 4 queries, each mask at most 4 x keys; the
    result is plain causal attention over context and chunk."""
    heads, kv_heads, dim, context, chunk = 4, 2, 64, 13, 10
    backend = TorchAttentionBackend(heads, kv_heads, dim, BLOCK, use_kernel=False)
    backend.query_tile = 4
    masks = []
    real_mask = torch_backend.causal_tail_mask

    def recording_mask(rows, keys, dtype, device):
        masks.append((rows, keys))
        return real_mask(rows, keys, dtype, device)

    monkeypatch.setattr(torch_backend, "causal_tail_mask", recording_mask)
    gen = torch.Generator().manual_seed(0)
    total = context + chunk
    k = torch.randn(total, kv_heads, dim, generator=gen)
    v = torch.randn(total, kv_heads, dim, generator=gen)
    q = torch.randn(chunk, heads, dim, generator=gen)
    table = [5, 0, 3, 6, 1, 2]  # ceil(23 / 4) blocks, out of order
    pool = (
        torch.zeros(8, *backend.cache_block_shape()),
        torch.zeros(8, *backend.cache_block_shape()),
    )
    slots = [table[p // BLOCK] * BLOCK + p % BLOCK for p in range(total)]
    # The context's K/V first (as an earlier step would have), then the chunk.
    cached = CommonAttentionMetadata(0, torch.tensor(slots[:context]), [context], [0], [table[:4]])
    meta = backend.metadata_builder.build(cached, torch.float32)
    backend.forward(torch.zeros(context, heads, dim), k[:context], v[:context], *pool, meta)
    common = CommonAttentionMetadata(0, torch.tensor(slots[context:]), [chunk], [context], [table])
    meta = backend.metadata_builder.build(common, torch.float32)
    masks.clear()
    out = backend.forward(q, k[context:], v[context:], *pool, meta)
    assert masks == [(4, 17), (4, 21), (2, 23)]
    expected = dense_attention(q, k, v, range(context, total))
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)


def test_causal_tail_mask_lets_each_query_see_its_own_past():
    mask = torch_backend.causal_tail_mask(2, 5, torch.bfloat16, "cpu")
    assert mask.dtype == torch.bfloat16
    # Queries at positions 3 and 4 of 5 keys.
    assert torch.isinf(mask).tolist() == [[False] * 4 + [True], [False] * 5]


def test_a_deterministic_step_makes_every_token_a_row_over_the_cache():
    """The gather path here (the kernel's rows: test_cpu_fast_paths.py)."""
    backend = TorchAttentionBackend(4, 2, 64, BLOCK, use_kernel=False)
    common = batch_layout()
    common.deterministic = True
    meta = backend.metadata_builder.build(common, torch.float32)
    assert meta.deterministic and not meta.prefills
    assert meta.num_decodes == 7
    assert meta.decode_table_rows.tolist() == [0, 1, 2, 2, 2, 3, 3]
    # Each token sees the keys up to and including its own position.
    assert meta.decode_kv_lens.tolist() == [6, 1, 1, 2, 3, 7, 8]
    assert meta.decode_block_tables.tolist() == [[7, 3], [9, 0], [1, 0], [2, 4]]
    # One gather group per row, padded to the row's own blocks only.
    assert [(g.start, g.end) for g in meta.decode_groups] == [(i, i + 1) for i in range(7)]
    assert [g.block_tables.tolist() for g in meta.decode_groups] == [
        [[7, 3]], [[9]], [[1]], [[1]], [[1]], [[2, 4]], [[2, 4]]
    ]  # fmt: skip
