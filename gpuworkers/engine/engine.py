"""LLMEngine: add_request / step / abort, and generate() for offline batches.

One step is: schedule, run, postprocess (a token's text, stop checks and
the outputs in postprocess.py). The engine is not thread-safe; exactly one
thread calls its methods (the worker loop).
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import time
from pathlib import Path

import torch

from gpuworkers.engine import offline
from gpuworkers.engine.config import EngineConfig
from gpuworkers.engine.detokenizer import IncrementalDetokenizer
from gpuworkers.engine.isolation import isolate
from gpuworkers.engine.kv_manager import KVCacheManager
from gpuworkers.engine.model_runner import ModelRunner
from gpuworkers.engine.models.loader import load_model
from gpuworkers.engine.outputs import GenerateOutput, RequestOutput
from gpuworkers.engine.postprocess import (
    Deltas,
    aborted_output,
    append_token,
    request_output,
    token_logprob,
)
from gpuworkers.engine.runtime import tune_allocator
from gpuworkers.engine.sampling import SampleResult, choice_seed, prepare_request
from gpuworkers.engine.sampling_params import SamplingParams
from gpuworkers.engine.scheduling import Scheduler
from gpuworkers.engine.scheduling.batch import CacheOps
from gpuworkers.engine.sequence import Request, Sequence, SequenceStatus, ServiceClass
from gpuworkers.engine.structured import GrammarCompiler
from tokenization.tokenizer import eos_token_ids, load_tokenizer

logger = logging.getLogger(__name__)

_SERVICE_CLASSES = tuple(c.value for c in ServiceClass)


class LLMEngine:
    def __init__(self, config: EngineConfig, model, model_cfg, tokenizer):
        self.config = config
        self.model_cfg = model_cfg
        self.tokenizer = tokenizer
        self.eos_token_ids = eos_token_ids(tokenizer, config.model_dir)
        self.max_model_len = config.max_model_len
        self.kv = KVCacheManager(
            config.num_kv_blocks,
            config.block_size,
            config.num_host_blocks,
            config.enable_prefix_caching,
            config.model_id,
        )
        self.scheduler = Scheduler(config, self.kv, self.max_model_len)
        self.runner = ModelRunner(config, model, model_cfg)
        self.grammars = GrammarCompiler(tokenizer, model_cfg.vocab_size, self.eos_token_ids)
        self.requests: dict[str, Request] = {}
        self._seq_ids = itertools.count()
        self._aborted: list[Request] = []
        # (request id, error) of requests failed by their own processing.
        self._failures: list[tuple[str, str]] = []
        # The last step ran a batch and none of it succeeded (its one
        # request failed): the worker counts these, like raised steps, to
        # tell a broken engine from one bad request.
        self.last_step_failed = False
        # (request id, positions) of each prefill chunk the last step computed.
        self.last_prefill_chunks: list[tuple[str, range]] = []
        self.num_steps = 0
        self.prompt_tokens_sent = 0
        self.prompt_tokens_computed = 0
        self.generated_tokens = 0

    @classmethod
    def from_pretrained(cls, path: str | Path, dtype: str = "auto", **engine_options):
        """Load a Hugging Face model directory and size the KV pool.

        ``engine_options`` are EngineConfig fields (kv_cache_bytes,
        max_num_seqs, max_num_batched_tokens, enable_prefix_caching, ...).
        """
        config = EngineConfig(model_dir=str(path), dtype=dtype, **engine_options)
        if config.device == "cpu":
            tune_allocator()
        if config.num_threads:
            torch.set_num_threads(config.num_threads)
        from gpuworkers.engine.models.config import ModelConfig

        model_cfg = ModelConfig.from_dir(path)
        config.model_id = config.model_id or Path(path).name
        limit = model_cfg.max_position_embeddings
        if model_cfg.sliding_window:
            # Attention here is not windowed: stay where the window is moot.
            limit = min(limit, model_cfg.sliding_window)
        config.max_model_len = min(config.max_model_len or limit, limit)
        per_token = model_cfg.kv_bytes_per_token(config.dtype, config.kv_cache_dtype)
        if not config.num_kv_blocks:
            config.num_kv_blocks = config.kv_blocks_for(per_token, config.kv_cache_bytes)
        if not config.num_host_blocks:
            config.num_host_blocks = config.kv_blocks_for(per_token, config.swap_space_bytes)
        if config.num_kv_blocks < 2:
            raise ValueError("kv_cache_bytes is too small for two KV blocks")
        model, model_cfg = load_model(
            path,
            config.dtype,
            config.device,
            config.max_model_len,
            config.cpu_fast_paths,
            config.quantization,
        )
        return cls(config, model, model_cfg, load_tokenizer(str(path)))

    # Requests -------------------------------------------------------------

    def add_request(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        params: SamplingParams,
        priority: int = 0,
        cache_salt: str | None = None,
        tier: str | None = None,
        tenant: str | None = None,
        service_class: ServiceClass | str = ServiceClass.DEFAULT,
    ) -> None:
        """Queue a request. Raises ValueError if it can never fit.

        ``tier``, ``tenant`` and ``service_class`` matter under the fair
        policy: tiers share by weight, a tier's tenants equally, and the
        class orders a tenant's own requests (batch: only leftovers).
        """
        if service_class not in _SERVICE_CLASSES:
            raise ValueError(
                f"unknown service_class {service_class!r}; one of {', '.join(_SERVICE_CLASSES)}"
            )
        if request_id in self.requests:
            raise ValueError(f"duplicate request id {request_id!r}")
        if not prompt_token_ids:
            raise ValueError("the prompt is empty")
        total = len(prompt_token_ids) + params.max_tokens
        if total > self.max_model_len:
            raise ValueError(
                f"prompt ({len(prompt_token_ids)} tokens) + max_tokens ({params.max_tokens})"
                f" exceeds the model's context of {self.max_model_len} tokens"
            )
        if params.n > self.config.max_num_seqs:
            raise ValueError(
                f"n={params.n} choices run side by side; this engine runs at most"
                f" {self.config.max_num_seqs} sequences"
            )
        # All n choices at their longest, as admission counts them, against
        # the per-request cap (one request may not take the whole pool) or
        # the pool: a request over it would block the queue head forever.
        # Refused under OPTIMISTIC admission too: there its choices could
        # only take turns preempting each other.
        need = self.scheduler.capacity.request_blocks(len(prompt_token_ids), params)
        cap = min(self.config.max_blocks_per_request or self.kv.num_total, self.kv.num_total)
        if need > cap:
            raise ValueError(
                f"the request needs {need} KV blocks ({params.n} choice(s) of up to {total}"
                f" tokens); the {'per-request cap' if cap < self.kv.num_total else 'pool'}"
                f" is {cap}"
            )
        request = Request(
            request_id,
            list(prompt_token_ids),
            params,
            priority,
            tier,
            cache_salt,
            tenant=tenant,
            service_class=ServiceClass(service_class),
        )
        # All n choices exist from the start, but only the first computes
        # the prompt; the scheduler forks the others off its blocks when
        # the prompt is done.
        for index in range(params.n):
            request.seqs.append(self._new_sequence(request, index, list(prompt_token_ids)))
        self.requests[request_id] = request
        self.prompt_tokens_sent += len(prompt_token_ids)
        self.scheduler.add(request.seqs[0])

    def _new_sequence(self, request: Request, index: int, token_ids: list[int]) -> Sequence:
        params = request.params
        if index == 0:
            # Raises before the request is registered if its ids do not fit.
            prepare_request(
                request,
                self.tokenizer,
                self.model_cfg.vocab_size,
                self.eos_token_ids,
                self.grammars,
            )
        seq = Sequence(
            next(self._seq_ids), request, index, token_ids, len(request.prompt_token_ids)
        )
        seq.seed = choice_seed(params.seed, index)
        seq.detokenizer = IncrementalDetokenizer(
            self.tokenizer,
            request.prompt_token_ids,
            params.stop,
            skip_special_tokens=params.skip_special_tokens,
            include_stop_str=params.include_stop_str_in_output,
            min_tokens=params.min_tokens,
        )
        seq.logprobs = [] if params.logprobs else None
        if request.grammar is not None:
            seq.grammar = request.grammar.new_state()
        return seq

    def abort(self, request_id: str) -> None:
        """Stop a request; its blocks are free before the next step runs."""
        request = self.requests.get(request_id)
        if request is None or request.aborted:
            return
        request.aborted = True
        for seq in request.seqs:
            if not seq.is_finished:
                self.scheduler.remove(seq)
                seq.status = SequenceStatus.FINISHED
                seq.finish_reason = "abort"
        self._aborted.append(request)

    def unique_id(self, prefix: str) -> str:
        """A request id no other request of this engine has (offline use)."""
        return f"{prefix}-{next(self._seq_ids)}"

    def has_unfinished_requests(self) -> bool:
        return bool(self.requests)

    # The step -------------------------------------------------------------

    def step(self) -> list[RequestOutput]:
        """Schedule, run the model once, sample; return this step's deltas.

        A request whose own processing raises (its rows in the forward pass
        or sampler, its detokenizer, its stop checks) is aborted and listed
        by ``take_failures``; the others' step goes on. A batch of one
        request that raises fails that request only (``last_step_failed``
        says so). An error that is no single request's propagates.
        """
        outputs = [self._final_output(r) for r in self._aborted]
        self._aborted.clear()
        self.last_step_failed = False
        batch = self.scheduler.schedule()
        self.last_prefill_chunks = []
        if batch.is_empty:
            return outputs
        # Once, before any attempt: isolation re-runs parts of the step.
        self.runner.apply_cache_ops(batch.cache_ops)
        batch = dataclasses.replace(batch, cache_ops=CacheOps())
        try:
            step_output = self.runner.execute(batch)
            sampled = step_output.sampled
            if step_output.prompt_logprobs:
                self._add_prompt_logprobs(batch, step_output.prompt_logprobs)
        except Exception as exc:
            isolated = isolate(self.runner.execute, self.scheduler.seqs, batch, exc)
            for request_id, error in isolated.failed.items():
                self._fail(request_id, error)
            self.last_step_failed = not isolated.parts
            batch, sampled = isolated.batch, isolated.sampled
            for sub, out in isolated.parts:
                if out.prompt_logprobs:
                    self._add_prompt_logprobs(sub, out.prompt_logprobs)
        # Prefill chunks of this step, before on_step_done may finish their
        # sequences: the worker's traces show one span per chunk. By
        # position, not by the batch's decode/prefill split: a prompt's last
        # chunk of one token is batched as a decode row.
        seqs = self.scheduler.seqs
        self.last_prefill_chunks = [
            (seqs[item.seq_id].request.request_id, item.positions)
            for item in batch.seqs
            if item.positions.start < seqs[item.seq_id].num_prompt_tokens
        ]
        self.num_steps += 1
        self.prompt_tokens_computed += batch.num_prompt_tokens
        emitted = self.scheduler.on_step_done(batch, [r.token_id for r in sampled])
        outputs.extend(self._postprocess(emitted, sampled))
        return outputs

    def _fail(self, request_id: str, error: Exception) -> None:
        """Abort one request for an error of its own; ``take_failures`` reports it."""
        logger.warning("request %s failed in the engine: %r", request_id, error)
        self.abort(request_id)
        self._failures.append((request_id, f"{type(error).__name__}: {error}"))

    def take_failures(self) -> list[tuple[str, str]]:
        """(request id, error) of the requests failed since the last call.

        Their KV blocks are already free; the next step's outputs end them
        with ``abort``, which the caller reports as a failure instead.
        """
        failures, self._failures = self._failures, []
        return failures

    def _postprocess(
        self, emitted: list[tuple[Sequence, int]], sampled: list[SampleResult]
    ) -> list[RequestOutput]:
        """Stop checks, text and logprobs for each new token; the step's outputs.

        A verification emits several tokens of one sequence in a row; the
        first that ends it drops the rest (already in ``token_ids``).
        """
        now = time.monotonic()
        deltas: Deltas = {}
        for i, (seq, index) in enumerate(emitted):
            if seq.is_finished or seq.request.aborted:
                # Ended by an earlier token of this step, or failed earlier in
                # this loop (a sibling choice).
                continue
            later = 0
            while i + later + 1 < len(emitted) and emitted[i + later + 1][0] is seq:
                later += 1
            try:
                self._append_token(seq, sampled[index], now, deltas, later)
            except Exception as exc:
                # The token's text or stop checks of this request alone.
                self._fail(seq.request.request_id, exc)
                deltas.pop(seq.request.request_id, None)
                continue
            if seq.is_finished and later:
                del seq.token_ids[-later:]
        outputs = []
        for request_id, choices in deltas.items():
            request = self.requests[request_id]
            finished = request.is_finished
            outputs.append(request_output(request, list(choices.values()), finished))
            if finished:
                del self.requests[request_id]
        return outputs

    def _append_token(
        self, seq: Sequence, result: SampleResult, now: float, deltas: Deltas, later: int = 0
    ) -> None:
        """Account for a token the scheduler appended to ``seq``, with
        ``later`` more of this step's tokens appended after it."""
        self.generated_tokens += 1
        finish = append_token(
            seq,
            result,
            now,
            deltas,
            later=later,
            tokenizer=self.tokenizer,
            max_model_len=self.max_model_len,
        )
        if finish:
            self.scheduler.remove(seq)
            seq.status = SequenceStatus.FINISHED

    def _add_prompt_logprobs(self, batch, found: dict[int, list[SampleResult]]) -> None:
        """Append the prompt logprobs a step computed to their requests."""
        for wanted in batch.prompt_logprobs:
            request = self.scheduler.seqs[wanted.seq_id].request
            entries = request.prompt_logprobs
            # Tokens whose KV came from the prefix cache were never computed
            # here: they have no logits, hence no logprob.
            entries.extend([None] * (wanted.positions.start + 1 - len(entries)))
            entries.extend(
                token_logprob(self.tokenizer, r.token_id, r) for r in found[wanted.seq_id]
            )

    def _final_output(self, request: Request) -> RequestOutput:
        self.requests.pop(request.request_id, None)
        return aborted_output(request)

    # Offline use and warm-up (offline.py) ----------------------------------

    def generate(
        self, prompts: list[str | list[int]], params: SamplingParams | list[SamplingParams]
    ) -> list[GenerateOutput]:
        """Run a batch to completion; outputs in prompt order."""
        return offline.generate(self, prompts, params)

    def warmup(self) -> float:
        """Run representative prefill and decode shapes once; returns seconds.

        The first passes pay for kernel selection and allocator growth; a
        worker reports ready only after this.
        """
        return offline.warmup(self)

    # Introspection --------------------------------------------------------

    @property
    def cpu_fast_paths(self) -> list[str]:
        """The CPU fast paths in use (engine/cpu/); empty on plain torch or CUDA."""
        enabled = list(getattr(self.runner.model, "cpu_fast_paths", []))
        backend = self.runner.backend
        prefill = getattr(backend, "prefill_kernel", None)
        if prefill is not None and prefill.supports(self.runner.dtype, self.runner.device):
            enabled.insert(0, "prefill-attention-kernel")
        if getattr(backend, "kernel", None) is not None:
            enabled.insert(0, "paged-decode-kernel")
        return enabled

    def stats(self) -> dict:
        sched = self.scheduler
        return {
            "running": len(sched.running),
            "waiting": len(sched.waiting),
            "swapped": len(sched.swapped),
            "kv_blocks_used": self.kv.allocator.num_used,
            "kv_blocks_total": self.kv.num_total,
            "kv_blocks_cached": self.kv.allocator.num_cached,
            "host_blocks_free": self.kv.host.num_free,
            "host_blocks_total": self.kv.host.num_blocks,
            "block_size": self.config.block_size,
            "prefix_cache_hit_tokens": self.kv.prefix_hit_tokens,
            "prompt_tokens_sent": self.prompt_tokens_sent,
            "prompt_tokens_computed": self.prompt_tokens_computed,
            "generated_tokens": self.generated_tokens,
            "queued_prompt_tokens": sum(s.num_uncomputed_tokens for s in sched.waiting),
            "preemptions": sched.num_preemptions,
            "swaps_out": sched.num_swaps_out,
            "swaps_in": sched.num_swaps_in,
            "recomputes": sched.num_recomputes,
            "steps": self.num_steps,
            "max_num_seqs": self.config.max_num_seqs,
            "scheduling_policy": self.config.scheduling_policy.value,
            "tier_weights": dict(self.config.tier_weights),
            "queued_by_tier": sched.queued_by_tier(),
            "queued_by_class": sched.queued_by_class(),
            # Under "fair": per tier, each active tenant's place in the fair
            # order (scheduling/fair_estimate.py); tenant ids, so never a
            # metric label. Empty under the other policies.
            "fair_queue": sched.fair_queue(),
            **sched.speculator.stats(),
        }
