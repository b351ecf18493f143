"""Engine, cache and scheduler settings."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum


class AdmissionPolicy(StrEnum):
    # Admit only when every running request's future growth (prompt +
    # max_tokens) still fits: no preemption in steady state.
    RESERVE = "reserve"
    # Admit on current size and preempt under pressure: more concurrency,
    # at the price of swaps or recomputes when outputs run long.
    OPTIMISTIC = "optimistic"


class SchedulingPolicyName(StrEnum):
    """Which SchedulingPolicy (engine/scheduling/) orders the work."""

    FCFS = "fcfs"  # arrival order only
    PRIORITY = "priority"  # higher priority first, then arrival
    # Weighted fair share between tiers, with lending; inside a tier,
    # tenants by virtual token counter; service classes within a tenant.
    FAIR = "fair"


DEFAULT_TIER_WEIGHTS = {"enterprise": 0.50, "pro": 0.35, "free": 0.15}


@dataclass(slots=True)
class EngineConfig:
    """Everything the engine needs besides the weights.

    ``num_kv_blocks`` is derived from ``kv_cache_bytes`` and the model's KV
    bytes per token when left at 0.
    """

    model_dir: str = ""
    model_id: str = ""
    # "auto": bfloat16 where the hardware computes in it, else float32 (CPU)
    # or float16 (CUDA); resolved once here, so every reader sees the
    # concrete dtype (engine/dtypes.py).
    dtype: str = "auto"
    device: str = "cpu"
    attention_backend: str = "auto"  # auto | torch | flashinfer
    # On CPU (engine/cpu/): decode attention and K/V writes in the compiled
    # kernels (built on first use; plain torch when off or unavailable), and
    # in bfloat16 also fused element-wise kernels and linear weights
    # pre-packed for oneDNN. Off: plain torch everywhere.
    cpu_fast_paths: bool = True
    # Weight-only quantization of every linear layer, the LM head included
    # (engine/quantization.py): None keeps the weights in ``dtype``; "int8"
    # keeps them as int8 with a float32 scale per output channel, which
    # halves the bytes a decode step reads in bfloat16. CPU only.
    quantization: str | None = None
    block_size: int = 16
    # The KV pool's element type: "auto" is the model dtype; "int8" stores
    # K and V as int8 with a float32 scale per (token, kv head), so
    # kv_cache_bytes holds about 1.9x the tokens of bfloat16 (3.8x of
    # float32) at a small accuracy cost (attention/kv_int8.py). Torch
    # attention backend only: FlashInfer's quantized KV cache is fp8.
    kv_cache_dtype: str = "auto"
    kv_cache_bytes: int = 512 << 20
    num_kv_blocks: int = 0
    # Host-memory pool for swapped-out sequences; 0 disables swapping (every
    # preemption then recomputes).
    swap_space_bytes: int = 256 << 20
    num_host_blocks: int = 0
    max_num_seqs: int = 64
    # Token budget per engine step: decodes first, then prefill chunks.
    # 2048 suits offline throughput (a 64-request batch prefilled 23% faster
    # than with 512, bench/decode_step.py); a serving worker uses less
    # (settings.ENGINE_MAX_BATCHED_TOKENS) so a long prompt arriving does not
    # stall the running streams for a whole large chunk.
    max_num_batched_tokens: int = 2048
    max_model_len: int = 0  # 0: the model's max_position_embeddings
    # Per-request cap on KV blocks; 0 means the whole pool.
    max_blocks_per_request: int = 0
    enable_prefix_caching: bool = True
    admission_policy: AdmissionPolicy = AdmissionPolicy.RESERVE
    scheduling_policy: SchedulingPolicyName = SchedulingPolicyName.PRIORITY
    tier_weights: dict[str, float] = field(default_factory=lambda: dict(DEFAULT_TIER_WEIGHTS))
    # Fair share between tenants inside a tier ("fair" policy): each
    # tenant's virtual token counter is charged these weights per prompt
    # token and per output token computed (VTC, Sheng et al., OSDI 2024,
    # whose default this is: an output token costs a decode step, a prompt
    # token a share of a batched prefill).
    fair_prompt_weight: float = 1.0
    fair_output_weight: float = 2.0
    # How far (in weighted tokens) a tenant's counter may run ahead of a
    # waiting tenant of its tier before the order is enforced. A tenant
    # whose next request does not fit (KV) may be overtaken by the others
    # until they are this far above it, then the tier waits for room for
    # it: short requests pass a long prompt waiting for KV, and the long
    # one's wait stays bounded (scheduling/fair_queue.py). And a tenant
    # under its share takes a running sequence back only from one served
    # this much more than itself (scheduling/fair_victims.py).
    fair_counter_slack: float = 2048.0
    # ... and only if that tenant is above the claimant by more than this,
    # both in units of their shares of the tier (running slots and KV),
    # once the claim runs: no capacity moves for a marginal gain.
    fair_preempt_margin: float = 0.25
    # Progress guarantee: a sequence that resumes after a preemption runs
    # this many engine steps before a claim may preempt it again, so
    # capacity never thrashes between claimants. A first start is not
    # guarded: capacity lent to an idle tier's or tenant's share comes back
    # at once. (KV exhaustion under optimistic admission may still take a
    # guarded one when no other is left: the step must make room.)
    preempt_min_steps: int = 4
    # The batch class's budget ("fair" policy). An interactive request that
    # arrives waits for the step in flight, whose length grows with its
    # rows (about 11 ms + 1.3 ms per row here, see speculative_fixed_cost_rows):
    # 64 batch decodes make every step several times an interactive one. So
    # while interactive work was queued or running within the last
    # batch_yield_seconds, batch sequences compute at most
    # batch_step_tokens tokens per step (decodes and prefill chunks
    # together); with none about, batch takes the whole step. 0: no cap.
    batch_step_tokens: int = 16
    batch_yield_seconds: float = 5.0
    num_threads: int = 0  # 0: leave torch's default
    # Every step batch-invariant: a request's tokens and logprobs are the
    # same bits whatever the prefix-cache state, chunking and the rest of
    # the batch (on this machine, dtype and thread count). Costs throughput
    # (bench/deterministic.py); requests can also ask for it one at a time
    # (SamplingParams.deterministic). docs/engine.md, "Determinism".
    deterministic: bool = False
    # Speculative decoding (engine/spec/): "ngram" drafts by prompt lookup
    # (the last prompt_lookup_max..min tokens found earlier in the
    # sequence, the tokens after them proposed) and verifies up to
    # num_speculative_tokens drafts per decode in one forward pass; None:
    # off. Exact: greedy tokens equal the non-speculative ones, sampled
    # ones follow the same distribution (spec/acceptance.py).
    speculative_method: str | None = "ngram"
    num_speculative_tokens: int = 4
    prompt_lookup_min: int = 2
    prompt_lookup_max: int = 4
    # No drafting at all in a step with more decoding sequences than this
    # (an operator's cap; the cost model below already decides per draft).
    speculative_max_batch: int = 256
    # The part of a step's time that does not grow with its query rows
    # (reading the weights, per-step work), in units of what one more row
    # costs: a draft is verified only while its chance of acceptance beats
    # the step's outputs per row-cost (spec/speculator.py). CPU, this
    # demo model, 2 threads: a decode step of 24..64 rows took about
    # 11 ms + 1.2..1.4 ms per row (docs/engine.md, "Speculative decoding"). A GPU
    # decode step is mostly weight reads: raise it there.
    speculative_fixed_cost_rows: float = 10.0
    # A sequence whose recent acceptance rate falls below this pauses
    # drafting for a while (spec/speculator.py).
    speculative_min_acceptance: float = 0.25

    def __post_init__(self) -> None:
        self.admission_policy = AdmissionPolicy(self.admission_policy)
        self.scheduling_policy = SchedulingPolicyName(self.scheduling_policy)
        if self.block_size < 1 or self.block_size & (self.block_size - 1):
            raise ValueError("block_size must be a power of two")
        if self.max_num_batched_tokens < 1 or self.max_num_seqs < 1:
            raise ValueError("max_num_batched_tokens and max_num_seqs must be >= 1")
        from gpuworkers.engine.dtypes import KV_CACHE_DTYPES, resolve_dtype

        self.dtype = resolve_dtype(self.dtype, self.device)
        if self.kv_cache_dtype not in KV_CACHE_DTYPES:
            raise ValueError(
                f"unknown kv_cache_dtype {self.kv_cache_dtype!r}; use 'auto' (the model dtype)"
                " or 'int8'"
            )
        if self.kv_cache_dtype == "int8" and self.attention_backend == "flashinfer":
            raise ValueError(
                "kv_cache_dtype='int8' needs the torch attention backend: FlashInfer has no"
                " int8 KV cache (its quantized cache is fp8, not offered here); use"
                " kv_cache_dtype='auto' with flashinfer, or attention_backend='torch'"
            )
        from gpuworkers.engine.quantization import check_quantization

        self.quantization = check_quantization(self.quantization)
        if self.quantization and self.device != "cpu":
            raise ValueError(f"quantization {self.quantization!r} runs on CPU only")
        if self.deterministic and self.attention_backend == "flashinfer":
            raise ValueError("deterministic mode needs the torch attention backend")
        if self.speculative_method not in (None, "ngram"):
            raise ValueError(f"unknown speculative_method {self.speculative_method!r}")
        if self.num_speculative_tokens < 1 or self.speculative_max_batch < 0:
            raise ValueError("num_speculative_tokens must be >= 1, speculative_max_batch >= 0")
        if self.speculative_fixed_cost_rows < 0:
            raise ValueError("speculative_fixed_cost_rows must be >= 0")
        if self.fair_prompt_weight < 0 or self.fair_output_weight < 0:
            raise ValueError("fair_prompt_weight and fair_output_weight must be >= 0")
        if min(self.fair_preempt_margin, self.fair_counter_slack, self.preempt_min_steps) < 0:
            raise ValueError(
                "fair_preempt_margin, fair_counter_slack and preempt_min_steps must be >= 0"
            )
        if self.batch_step_tokens < 0 or self.batch_yield_seconds < 0:
            raise ValueError("batch_step_tokens and batch_yield_seconds must be >= 0")
        if not 1 <= self.prompt_lookup_min <= self.prompt_lookup_max:
            raise ValueError("need 1 <= prompt_lookup_min <= prompt_lookup_max")

    @property
    def cache_dtype(self) -> str:
        """The KV pool's element type: "int8", or the model dtype."""
        return "int8" if self.kv_cache_dtype == "int8" else self.dtype

    def kv_blocks_for(self, kv_bytes_per_token: int, budget: int) -> int:
        """How many blocks of ``block_size`` tokens fit in ``budget`` bytes."""
        return budget // (kv_bytes_per_token * self.block_size)
