"""Owns the weights and the KV tensors; runs one forward pass per step.

Every step's tokens (decodes first, then prefill chunks) are flattened into
one batch; index tensors for attention are built once per step here, not
per layer.
"""

from __future__ import annotations

import torch

from gpuworkers.engine.attention import AttentionMetadata, PrefillSpan, select_backend
from gpuworkers.engine.attention.metadata import additive_mask
from gpuworkers.engine.config import EngineConfig
from gpuworkers.engine.models.config import ModelConfig
from gpuworkers.engine.models.loader import TORCH_DTYPES
from gpuworkers.engine.scheduler import SchedulerOutput


class ModelRunner:
    def __init__(self, config: EngineConfig, model, model_cfg: ModelConfig):
        self.config = config
        self.model = model
        self.model_cfg = model_cfg
        self.device = torch.device(config.device)
        self.dtype = TORCH_DTYPES[config.dtype]
        self.block_size = config.block_size
        backend_cls = select_backend(config.attention_backend, config.device)
        options = {"use_kernel": config.cpu_fast_paths} if backend_cls.name == "torch" else {}
        self.backend = backend_cls(
            model_cfg.num_heads,
            model_cfg.num_kv_heads,
            model_cfg.head_dim,
            config.block_size,
            **options,
        )
        # One preallocated pool, [layers, K/V, blocks, *block layout]; the
        # block layout is the backend's. Zeros so padded gathers never read NaNs.
        block = self.backend.cache_block_shape()
        shape = (model_cfg.num_layers, 2, config.num_kv_blocks, *block)
        self.kv_cache = torch.zeros(shape, dtype=self.dtype, device=self.device)
        host_shape = (model_cfg.num_layers, 2, config.num_host_blocks, *block)
        self.host_cache = torch.zeros(
            host_shape, dtype=self.dtype, pin_memory=self.device.type == "cuda"
        )

    # Cache operations -----------------------------------------------------

    def apply_cache_ops(self, out: SchedulerOutput) -> None:
        """Swaps and copy-on-write copies, before the step's forward pass."""
        if out.swap_out:
            dev, host = _pairs(out.swap_out)
            self.host_cache[:, :, host] = self.kv_cache[:, :, dev.to(self.device)].to("cpu")
        if out.swap_in:
            host, dev = _pairs(out.swap_in)
            self.kv_cache[:, :, dev.to(self.device)] = self.host_cache[:, :, host].to(self.device)
        if out.copies:
            src, dst = _pairs(out.copies)
            self.kv_cache[:, :, dst.to(self.device)] = self.kv_cache[:, :, src.to(self.device)]

    # Forward ------------------------------------------------------------

    def execute(self, out: SchedulerOutput) -> torch.Tensor | None:
        """Run the scheduled tokens; float32 logits, one row per sampled sequence
        in ``out.scheduled`` order (only those with ``needs_sample``)."""
        self.apply_cache_ops(out)
        if not out.scheduled:
            return None
        input_ids, positions, logits_indices, meta = self.prepare(out)
        self.backend.plan(meta, self.dtype)
        return self.model(input_ids, positions, self.kv_cache, meta, self.backend, logits_indices)

    def prepare(self, out: SchedulerOutput):
        bs = self.block_size
        ids: list[int] = []
        pos: list[int] = []
        slots: list[int] = []
        logits_indices: list[int] = []
        decode_tables: list[list[int]] = []
        decode_lens: list[int] = []
        prefills: list[PrefillSpan] = []
        for item in out.scheduled:
            seq, n = item.seq, item.num_new_tokens
            start = seq.num_computed_tokens
            table = seq.block_table
            query_start = len(ids)
            ids.extend(seq.token_ids[start : start + n])
            for p in range(start, start + n):
                pos.append(p)
                slots.append(table[p // bs] * bs + p % bs)
            if item.needs_sample:
                logits_indices.append(query_start + n - 1)
            if n == 1:
                decode_tables.append(table[: (start + bs) // bs])
                decode_lens.append(start + 1)
            else:
                prefills.append(self._prefill_span(query_start, n, start, table))
        meta = AttentionMetadata(
            num_decodes=len(decode_tables),
            slot_mapping=self._tensor(slots),
            prefills=prefills,
        )
        if decode_tables:
            meta.decode_block_tables = self._tensor(_pad(decode_tables))
            meta.decode_kv_lens = self._tensor(decode_lens)
        return (
            self._tensor(ids),
            self._tensor(pos),
            self._tensor(logits_indices),
            meta,
        )

    def _prefill_span(self, query_start: int, n: int, start: int, table: list[int]) -> PrefillSpan:
        kv_len = start + n
        span = PrefillSpan(
            query_start=query_start,
            query_len=n,
            context_len=start,
            block_table=self._tensor(table[: -(-kv_len // self.block_size)]),
        )
        if start:
            key_pos = torch.arange(kv_len, device=self.device)
            query_pos = torch.arange(start, kv_len, device=self.device)
            span.bias = additive_mask(key_pos[None, :] <= query_pos[:, None])
        return span

    def _tensor(self, values) -> torch.Tensor:
        return torch.tensor(values, dtype=torch.long, device=self.device)


def _pad(tables: list[list[int]]) -> list[list[int]]:
    width = max(len(t) for t in tables)
    return [t + [0] * (width - len(t)) for t in tables]


def _pairs(pairs: list[tuple[int, int]]) -> tuple[torch.Tensor, torch.Tensor]:
    first, second = zip(*pairs, strict=True)
    return torch.tensor(first, dtype=torch.long), torch.tensor(second, dtype=torch.long)
