"""Offline use of an engine: run a batch to completion, and warm-up.

Both drive ``LLMEngine``'s public step loop; they are the engine's
``generate`` and ``warmup`` methods.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import torch

from gpuworkers.engine.outputs import CompletionChoice, GenerateOutput
from gpuworkers.engine.sampling_params import SamplingParams

if TYPE_CHECKING:
    from gpuworkers.engine.engine import LLMEngine


def generate(
    engine: LLMEngine, prompts: list[str | list[int]], params: SamplingParams | list[SamplingParams]
) -> list[GenerateOutput]:
    """Run a batch to completion; outputs in prompt order."""
    params_list = params if isinstance(params, list) else [params] * len(prompts)
    results: dict[str, GenerateOutput] = {}
    order = []
    for prompt, p in zip(prompts, params_list, strict=True):
        token_ids = engine.tokenizer(prompt).input_ids if isinstance(prompt, str) else list(prompt)
        request_id = engine.unique_id("generate")
        engine.add_request(request_id, token_ids, p)
        order.append(request_id)
        results[request_id] = GenerateOutput(
            request_id,
            token_ids,
            [CompletionChoice(i, [], "", None, [] if p.logprobs else None) for i in range(p.n)],
        )
    pending = set(order)
    while pending:
        progress = (engine.num_steps, engine.scheduler.num_preemptions)
        outputs = engine.step()
        idle = progress == (engine.num_steps, engine.scheduler.num_preemptions)
        if idle and not (outputs or engine.scheduler.running):
            # Nothing ran, nothing moved: every later step would be the
            # same empty one. add_request refuses what can never fit, so
            # this is a bug, not a wait; fail loudly instead of spinning.
            stuck = sorted(pending)
            for request_id in stuck:
                engine.abort(request_id)
            engine.step()  # their final outputs: the engine forgets them
            raise RuntimeError(f"the engine cannot schedule {', '.join(stuck)}; aborted")
        for output in outputs:
            result = results[output.request_id]
            result.num_cached_tokens = output.num_cached_tokens
            result.num_draft_tokens = output.num_draft_tokens
            result.num_accepted_tokens = output.num_accepted_tokens
            if output.prompt_logprobs is not None:
                result.prompt_logprobs = output.prompt_logprobs
            for delta in output.choices:
                choice = result.choices[delta.index]
                choice.token_ids.extend(delta.token_ids)
                choice.text += delta.text
                if delta.logprobs:
                    choice.logprobs.extend(delta.logprobs)
                choice.finish_reason = delta.finish_reason or choice.finish_reason
            if output.finished:
                pending.discard(output.request_id)
    return [results[r] for r in order]


def warmup(engine: LLMEngine) -> float:
    """Run representative prefill and decode shapes once; returns seconds.

    The first passes pay for kernel selection and allocator growth; a
    worker reports ready only after this.
    """
    started = time.monotonic()
    # The grammar tokenizer's trie takes about a second: not on a request.
    engine.grammars.prepare()
    vocab = min(engine.model_cfg.vocab_size, 32000)
    budget = engine.config.max_num_batched_tokens
    prompt_len = max(2, min(budget, engine.max_model_len - 16, 512))
    generator = torch.Generator().manual_seed(0)
    params = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
    batch = max(1, min(8, engine.config.max_num_seqs))
    prompts = []
    for i in range(batch):
        length = prompt_len if i == 0 else max(2, prompt_len // 8)
        prompts.append(torch.randint(100, vocab, (length,), generator=generator).tolist())
    # A salt no real request uses, so warm-up blocks never match real prompts.
    for i, prompt in enumerate(prompts):
        engine.add_request(f"warmup-{i}", prompt, params, cache_salt="warmup")
    while engine.requests:
        engine.step()
    engine.prompt_tokens_sent = engine.prompt_tokens_computed = engine.generated_tokens = 0
    engine.kv.prefix_hit_tokens = engine.kv.prefix_query_tokens = 0
    return time.monotonic() - started
