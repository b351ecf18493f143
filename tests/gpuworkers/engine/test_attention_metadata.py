"""Each backend's metadata builder from the runner's common metadata: the
torch backend's index tensors and masks, FlashInfer's page tables (no
masks). No model, no GPU: FlashInfer's wrappers are stood in for."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from gpuworkers.engine.attention import CommonAttentionMetadata
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


def test_torch_builder_pads_decode_tables_and_masks_only_chunks_after_context():
    backend = TorchAttentionBackend(4, 2, 64, BLOCK, use_kernel=False)
    common = batch_layout()
    meta = backend.metadata_builder.build(common, torch.float32)
    assert meta.decode_block_tables.tolist() == [[7, 3], [9, 0]]
    assert meta.decode_kv_lens.tolist() == [6, 1]
    spans = [(s.query_start, s.query_len, s.context_len) for s in meta.prefills]
    assert spans == [(2, 3, 0), (5, 2, 6)]
    fresh, after_context = meta.prefills
    assert fresh.bias is None, "a chunk with no context runs with is_causal"
    assert after_context.block_table.tolist() == [2, 4]
    # Queries at positions 6 and 7 over 8 keys: the first must not see key 7.
    masked = torch.isinf(after_context.bias).tolist()
    assert masked == [[False] * 7 + [True], [False] * 8]
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
    assert set(FlashInferMetadata.__slots__) == {"num_decodes", "num_prefills", "slot_mapping"}


def test_flashinfer_builder_plans_only_the_wrappers_in_use():
    backend = flashinfer_stand_in()
    decodes_only = CommonAttentionMetadata(1, torch.tensor([5]), [1], [5], [[2, 8]])
    FlashInferMetadataBuilder(backend).build(decodes_only, torch.bfloat16)
    assert len(backend.decode_wrapper.plans) == 1 and not backend.prefill_wrapper.plans
