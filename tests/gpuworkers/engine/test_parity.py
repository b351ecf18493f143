"""Greedy output is token-for-token identical to transformers' generate().

The reference is Hugging Face's own ``generate`` on the same float32 weights;
the engine must match it however the batch is scheduled: prefix cache off
and on, chunked prefill, swap and recompute preemption, n=2 and aborts.
"""

from __future__ import annotations

import pytest
import torch

from gpuworkers.engine import SamplingParams

MAX_TOKENS = 24
# Requests join the batch in waves, a few engine steps apart.
ARRIVAL_STEPS = [0, 0, 1, 3, 3, 5, 8, 12]


@pytest.fixture(scope="module")
def hf_reference(demo_dir, chat_prompts):
    """transformers' greedy continuation of each prompt, computed one at a time."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(demo_dir), dtype=torch.float32)
    model.eval()
    references = []
    with torch.inference_mode():
        for ids in chat_prompts:
            out = model.generate(
                torch.tensor([ids]),
                attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                max_new_tokens=MAX_TOKENS,
                do_sample=False,
                eos_token_id=2,
                pad_token_id=2,
            )
            references.append(out[0, len(ids) :].tolist())
    return references


def run_staggered(engine, prompts, params, abort_at=None):
    """Add prompts at ARRIVAL_STEPS; optionally abort one request mid-run."""
    outputs = {f"r{i}": [] for i in range(len(prompts))}
    finish = {}
    step = 0
    added = 0
    while added < len(prompts) or engine.has_unfinished_requests():
        while added < len(prompts) and ARRIVAL_STEPS[added] <= step:
            engine.add_request(f"r{added}", prompts[added], params)
            added += 1
        if abort_at and step == abort_at[1]:
            engine.abort(abort_at[0])
        for out in engine.step():
            for choice in out.choices:
                key = out.request_id if choice.index == 0 else f"{out.request_id}/{choice.index}"
                outputs.setdefault(key, []).extend(choice.token_ids)
                if choice.finish_reason:
                    finish[key] = choice.finish_reason
        step += 1
        assert step < 2000, "engine made no progress"
    return outputs, finish


GREEDY = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0)


def assert_matches(outputs, hf_reference, skip=()):
    for i, expected in enumerate(hf_reference):
        if f"r{i}" in skip:
            continue
        assert outputs[f"r{i}"] == expected, f"request r{i} diverged from transformers"


def assert_pool_drained(engine):
    stats = engine.stats()
    assert stats["kv_blocks_used"] == 0
    assert stats["host_blocks_free"] == stats["host_blocks_total"]
    engine.kv.allocator.check_invariants()


def test_matches_hf_with_prefix_cache_off(make_engine, chat_prompts, hf_reference):
    engine = make_engine(enable_prefix_caching=False)
    outputs, _ = run_staggered(engine, chat_prompts, GREEDY)
    assert_matches(outputs, hf_reference)
    assert engine.stats()["prefix_cache_hit_tokens"] == 0
    assert_pool_drained(engine)


def test_matches_hf_with_prefix_cache_on(make_engine, chat_prompts, hf_reference):
    """The shared system prompt is served from cache on the second pass."""
    engine = make_engine(enable_prefix_caching=True)
    run_staggered(engine, chat_prompts, GREEDY)
    outputs, _ = run_staggered(engine, chat_prompts, GREEDY)
    assert_matches(outputs, hf_reference)
    assert engine.stats()["prefix_cache_hit_tokens"] > 0
    assert_pool_drained(engine)


def test_matches_hf_with_chunked_prefill(make_engine, chat_prompts, hf_reference):
    """A 32-token step budget splits every prompt into chunks."""
    engine = make_engine(max_num_batched_tokens=32, enable_prefix_caching=False)
    outputs, _ = run_staggered(engine, chat_prompts, GREEDY)
    assert_matches(outputs, hf_reference)
    assert_pool_drained(engine)


def test_matches_hf_on_the_plain_torch_path(make_engine, chat_prompts, hf_reference):
    """CPU fast paths off: decode attention on the gather + matmul path."""
    engine = make_engine(max_num_batched_tokens=32, cpu_fast_paths=False)
    assert engine.runner.backend.kernel is None
    outputs, _ = run_staggered(engine, chat_prompts, GREEDY)
    assert_matches(outputs, hf_reference)
    assert_pool_drained(engine)


def test_matches_hf_when_swapped_out_and_back(make_engine, chat_prompts, hf_reference):
    """A pool too small for the batch swaps sequences to host memory and back."""
    engine = make_engine(
        num_kv_blocks=14, num_host_blocks=64, admission_policy="optimistic",
        enable_prefix_caching=False,
    )  # fmt: skip
    outputs, _ = run_staggered(engine, chat_prompts, GREEDY)
    stats = engine.stats()
    assert stats["swaps_out"] > 0 and stats["swaps_in"] == stats["swaps_out"]
    assert stats["recomputes"] == 0
    assert_matches(outputs, hf_reference)
    assert_pool_drained(engine)


def test_matches_hf_when_recompute_is_the_fallback(make_engine, chat_prompts, hf_reference):
    """With no host pool to swap into, preempted sequences are recomputed."""
    engine = make_engine(
        num_kv_blocks=14, num_host_blocks=0, admission_policy="optimistic",
        enable_prefix_caching=False,
    )  # fmt: skip
    outputs, _ = run_staggered(engine, chat_prompts, GREEDY)
    stats = engine.stats()
    assert stats["recomputes"] > 0 and stats["swaps_out"] == 0
    assert_matches(outputs, hf_reference)
    assert_pool_drained(engine)


def test_n2_both_choices_match_hf(make_engine, chat_prompts, hf_reference):
    engine = make_engine()
    params = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, n=2)
    outputs, _ = run_staggered(engine, chat_prompts, params)
    for i, expected in enumerate(hf_reference):
        assert outputs[f"r{i}"] == expected
        assert outputs[f"r{i}/1"] == expected
    assert_pool_drained(engine)


def test_abort_mid_batch_leaves_others_unchanged(make_engine, chat_prompts, hf_reference):
    engine = make_engine()
    outputs, finish = run_staggered(engine, chat_prompts, GREEDY, abort_at=("r1", 6))
    assert finish["r1"] == "abort"
    assert len(outputs["r1"]) < len(hf_reference[1])
    assert_matches(outputs, hf_reference, skip={"r1"})
    assert_pool_drained(engine)


def test_per_request_kv_block_cap_refuses_oversized_requests(make_engine, chat_prompts):
    """A request whose prompt + max_tokens needs more blocks than the cap is
    refused at add_request, before it takes any block."""
    engine = make_engine(max_blocks_per_request=3)
    prompt = chat_prompts[4]  # 48 tokens + 24 to generate: five blocks
    with pytest.raises(ValueError, match="KV blocks"):
        engine.add_request("too-big", prompt, GREEDY)
    assert engine.stats()["kv_blocks_used"] == 0 and not engine.has_unfinished_requests()
    engine.add_request("fits", chat_prompts[6][:20], SamplingParams(max_tokens=8, temperature=0.0))
    while engine.has_unfinished_requests():
        engine.step()
    assert_pool_drained(engine)


def test_n2_abort_before_the_prompt_is_done_reports_the_started_choice(make_engine, chat_prompts):
    """Aborted mid-prefill, an n=2 request reports only choice 0 (its sibling
    never forked, never started) and leaves nothing behind."""
    engine = make_engine(max_num_batched_tokens=16)
    params = SamplingParams(max_tokens=4, temperature=0.0, n=2)
    engine.add_request("r", chat_prompts[4], params)
    assert engine.step() == []
    engine.abort("r")
    (output,) = engine.step()
    assert output.finished and [(c.index, c.finish_reason) for c in output.choices] == [
        (0, "abort")
    ]
    assert not engine.has_unfinished_requests()
    assert_pool_drained(engine)


# Requests that can never run -------------------------------------------------


@pytest.mark.parametrize("admission", ["reserve", "optimistic"])
@pytest.mark.parametrize(
    ("pool", "cap", "n"),
    [(8, 0, 3), (64, 5, 3)],
    ids=["pool", "max_blocks_per_request"],
)
def test_n_choices_that_can_never_fit_together_are_refused(make_engine, admission, pool, cap, n):
    """20 prompt tokens + 40 to generate: 4 blocks for the first choice and
    4 more for each other (its outputs plus the copy of the shared partial
    block). Three choices need 12 blocks: over an 8-block pool, or over a
    per-request cap of 5 blocks (here 20 + 8 tokens: 2 + 2 + 2 = 6), they
    are refused at add_request, naming the numbers; one choice fewer is
    served."""
    engine = make_engine(num_kv_blocks=pool, max_blocks_per_request=cap, admission_policy=admission)
    prompt = list(range(1000, 1020))
    max_tokens = 40 if cap == 0 else 8
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, n=n, ignore_eos=True)
    needed, limit = (12, 8) if cap == 0 else (6, 5)
    with pytest.raises(ValueError, match=f"needs {needed} KV blocks.* {limit}"):
        engine.add_request("never", prompt, params)
    assert not engine.has_unfinished_requests() and not engine.scheduler.has_unfinished()
    params.n = n - 1
    (output,) = engine.generate([prompt], params)
    assert [len(c.token_ids) for c in output.choices] == [max_tokens] * (n - 1)
    assert_pool_drained(engine)


def test_more_choices_than_running_seats_are_refused(make_engine):
    """n choices run side by side: n above max_num_seqs could never start."""
    engine = make_engine(max_num_seqs=2)
    with pytest.raises(ValueError, match="n=3 .* 2"):
        engine.add_request("wide", [1, 2, 3], SamplingParams(max_tokens=2, n=3))
    assert not engine.has_unfinished_requests()


@pytest.mark.timeout(60)
def test_generate_raises_instead_of_spinning_when_nothing_can_run(make_engine):
    """With nothing running and the queue head unable to start (here: the
    pool's blocks held outside the scheduler), generate() stops with an
    error naming the stuck requests instead of stepping forever, and leaves
    them aborted."""
    engine = make_engine(num_kv_blocks=8)
    held = [engine.kv.allocator.allocate() for _ in range(7)]
    params = SamplingParams(max_tokens=20, temperature=0.0)
    with pytest.raises(RuntimeError, match="generate-"):
        engine.generate([list(range(1000, 1020))], params)
    assert not engine.has_unfinished_requests() and not engine.scheduler.has_unfinished()
    for block_id in held:
        engine.kv.allocator.free(block_id)
    (output,) = engine.generate([list(range(1000, 1020))], params)
    assert len(output.choices[0].token_ids) == 20
    assert_pool_drained(engine)


# Sampled n > 1: copy-on-write must not leak between choices ------------------


def test_sampled_choices_sharing_a_prompt_match_runs_that_never_copy_on_write(
    make_engine, chat_prompts
):
    """Three sampled (temperature 1, seeded) choices fork off a 39-token
    prompt whose last block (16-token blocks) is partial: each choice's
    first tokens go into its own copy of it. The reference is the same
    request on 1-token blocks, where every shared block is full and nothing
    is ever copied: same seed, same logits, so each choice must match its
    reference token for token, while the choices differ from each other.
    A missed or misplaced copy would let one choice write into another's
    context."""
    prompt = chat_prompts[3]
    assert len(prompt) % 16 != 0, "the prompt must end in a partial block"
    params = SamplingParams(max_tokens=16, temperature=1.0, seed=1234, n=3, ignore_eos=True)
    (shared,) = make_engine(block_size=16).generate([prompt], params)
    reference_engine = make_engine(block_size=1, num_kv_blocks=1024, enable_prefix_caching=False)
    (reference,) = reference_engine.generate([prompt], params)
    choices = [c.token_ids for c in shared.choices]
    assert len({tuple(c) for c in choices}) == 3, "the choices must differ to prove anything"
    assert choices == [c.token_ids for c in reference.choices]
