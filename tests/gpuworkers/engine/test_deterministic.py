"""Deterministic mode (issue 14): the same request gives bitwise the same
tokens and logprobs alone, in a mixed batch, chunked and after a
prefix-cache hit, in bfloat16 (CPU fast paths on) and in float32 on plain
torch (no compiled kernels), as an engine option and as a per-request
flag. Also the two properties it is built on: batch-invariant linears and
a prefix-cache hash space of its own."""

from __future__ import annotations

import pytest
import torch

from gpuworkers.engine import EngineConfig, LLMEngine, SamplingParams
from gpuworkers.engine.cpu import build
from gpuworkers.engine.cpu.packing import PackedLinear, packing_available
from gpuworkers.engine.cpu.tile_linear import tile_linear_kind
from gpuworkers.engine.models.batch_invariant import INVARIANT_ROWS, linear
from gpuworkers.engine.models.loader import load_model
from gpuworkers.engine.prefix_cache import hash_full_blocks

GREEDY = SamplingParams(
    max_tokens=12, temperature=0.0, logprobs=True, top_logprobs=2, ignore_eos=True
)
SEEDED = SamplingParams(
    max_tokens=12,
    temperature=0.8,
    top_p=0.9,
    seed=7,
    logprobs=True,
    top_logprobs=2,
    ignore_eos=True,
)


@pytest.fixture(scope="module")
def bf16_model(demo_dir):
    torch.set_num_threads(2)
    return load_model(demo_dir, "bfloat16", "cpu", 2048)


@pytest.fixture(scope="module")
def bf16_engine(bf16_model, tokenizer, demo_dir):
    """A fresh bfloat16 engine over shared weights (CPU fast paths on)."""
    model, model_cfg = bf16_model

    def build(**options) -> LLMEngine:
        options.setdefault("num_kv_blocks", 256)
        options.setdefault("num_host_blocks", 64)
        config = EngineConfig(
            model_dir=str(demo_dir),
            model_id="demo",
            dtype="bfloat16",
            max_model_len=2048,
            **options,
        )
        return LLMEngine(config, model, model_cfg, tokenizer)

    return build


def drive(engine: LLMEngine, first: list, then: list, steps_between: int = 2) -> dict:
    """Add ``first``, run a few steps, add ``then``, run to the end.

    Entries are (request id, prompt ids, params[, cache salt]). Returns, per request id,
    its tokens and each token's logprob and top alternatives as float hex
    (so that equality means the same bits), and its cached prompt tokens.
    """
    results: dict[str, dict] = {}

    def collect(outputs) -> None:
        for out in outputs:
            entry = results.setdefault(out.request_id, {"tokens": [], "logprobs": []})
            entry["cached"] = out.num_cached_tokens
            for delta in out.choices:
                entry["tokens"] += delta.token_ids
                for lp in delta.logprobs or []:
                    top = [(t, v.hex()) for t, _, v in lp.top]
                    entry["logprobs"].append((lp.token_id, lp.logprob.hex(), top))

    for request_id, prompt, params, *salt in first:
        engine.add_request(request_id, prompt, params, cache_salt=(salt or [None])[0])
    for _ in range(steps_between):
        collect(engine.step())
    for request_id, prompt, params, *salt in then:
        engine.add_request(request_id, prompt, params, cache_salt=(salt or [None])[0])
    while engine.has_unfinished_requests():
        collect(engine.step())
    return results


def targets(chat_prompts, deterministic: bool = False) -> list:
    """One greedy and one seeded sampled request, both with logprobs."""
    flag = {"deterministic": True} if deterministic else {}
    return [
        ("greedy", chat_prompts[1], SamplingParams(**_fields(GREEDY), **flag)),
        ("seeded", chat_prompts[4], SamplingParams(**_fields(SEEDED), **flag)),
    ]


def others(chat_prompts) -> list:
    """Regular requests of other lengths that finish at other steps."""
    return [
        (f"other-{i}", chat_prompts[i], SamplingParams(max_tokens=3 + 4 * k, temperature=0.7))
        for k, i in enumerate((0, 3, 7, 2))
    ]


def _fields(params: SamplingParams) -> dict:
    return {name: getattr(params, name) for name in params.__slots__ if name != "deterministic"}


def view(results: dict, names=("greedy", "seeded")) -> dict:
    return {name: (results[name]["tokens"], results[name]["logprobs"]) for name in names}


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["bfloat16", "float32-plain-torch"])
def test_deterministic_engine_gives_the_same_bits_alone_mixed_chunked_and_cached(
    kind, bf16_engine, make_engine, chat_prompts
):
    """Plain torch: the gather path's one group per row and MKL's float32
    linears (which on their own differ by batch size on AVX-512 CPUs)."""
    if kind == "bfloat16":
        build = bf16_engine
    else:
        build = lambda **options: make_engine(cpu_fast_paths=False, **options)  # noqa: E731
    requests = targets(chat_prompts)
    # Alone: each request on its own, nothing cached.
    alone = {}
    for request in requests:
        engine = build(deterministic=True, enable_prefix_caching=False)
        alone.update(view(drive(engine, [request], []), [request[0]]))
    assert all(len(tokens) == 12 for tokens, _ in alone.values())
    # Mixed: prefilled while four other requests decode, which then finish
    # one after another (every decode step a different batch).
    mixed = drive(build(deterministic=True), others(chat_prompts), requests)
    # Chunked: a 16-token budget cuts every prompt into chunks, shared with
    # the other target's chunks and decodes.
    chunked = drive(build(deterministic=True, max_num_batched_tokens=16), requests, [], 0)
    # After a cache hit: the same prompts again, now mostly from the cache.
    engine = build(deterministic=True)
    drive(engine, requests, [], 0)
    cached = drive(engine, [(f"again-{n}", p, s) for n, p, s in requests], [], 0)
    cached = {name.removeprefix("again-"): entry for name, entry in cached.items()}
    assert all(entry["cached"] >= 32 for entry in cached.values()), "no prefix-cache hit"

    assert view(mixed) == alone
    assert view(chunked) == alone
    assert view(cached) == alone


@pytest.mark.slow
def test_a_deterministic_request_in_a_regular_engine_equals_itself_alone(bf16_engine, chat_prompts):
    """The per-request flag: its steps run batch-invariant, whoever shares
    them, and it never hits blocks that regular requests computed."""
    # Each prompt in a cache-salt space of its own: the two targets share
    # the chat template's first block, and must not hit each other's here.
    requests = [(*r, r[0]) for r in targets(chat_prompts, deterministic=True)]
    alone = {}
    for request in requests:
        engine = bf16_engine(enable_prefix_caching=False)
        alone.update(view(drive(engine, [request], []), [request[0]]))
    engine = bf16_engine(max_num_batched_tokens=32)
    # Regular requests of the very same prompts first: their blocks are in
    # the cache, computed by the regular kernels.
    same_prompts = [(f"regular-{n}", p, SamplingParams(max_tokens=4), n) for n, p, *_ in requests]
    mixed = drive(engine, same_prompts + others(chat_prompts), requests)
    assert mixed["regular-greedy"]["cached"] == 0
    assert all(mixed[name]["cached"] == 0 for name in ("greedy", "seeded"))
    assert view(mixed) == alone


def test_deterministic_requests_hash_prefix_blocks_apart():
    tokens = list(range(40))
    regular = hash_full_blocks(tokens, 16, "m", "tenant")
    deterministic = hash_full_blocks(tokens, 16, "m", "tenant", deterministic=True)
    assert len(regular) == len(deterministic) == 2
    assert not set(regular) & set(deterministic)
    assert hash_full_blocks(tokens, 16, "m", "tenant", deterministic=True) == deterministic


def linears() -> list[tuple[str, torch.nn.Module, torch.dtype]]:
    """The demo model's linear shapes, as the engine runs them."""
    gen = torch.Generator().manual_seed(0)
    built = []
    for features, out in [(576, 960), (576, 3072), (1536, 576), (576, 49152)]:
        layer = torch.nn.Linear(features, out, bias=False)
        with torch.no_grad():
            layer.weight.copy_(torch.randn(out, features, generator=gen) * 0.05)
        built.append((f"float32 {features}x{out}", layer, torch.float32))
        bf16 = torch.nn.Linear(features, out, bias=False).to(torch.bfloat16)
        with torch.no_grad():
            bf16.weight.copy_(layer.weight)
        # This machine's tile linear (AMX or vdpbf16ps) runs untiled: its
        # rows must keep their bits on their own.
        if (kind := tile_linear_kind(build.cpu_library())) is not None:
            built.append(
                (f"tile {features}x{out}", kind(build.cpu_library(), bf16), torch.bfloat16)
            )
        if packing_available(torch.bfloat16, "cpu"):
            bf16 = PackedLinear(bf16)
        built.append((f"bfloat16 {features}x{out}", bf16, torch.bfloat16))
    return built


@pytest.mark.parametrize(("name", "layer", "dtype"), linears(), ids=lambda v: str(v)[:24])
@torch.inference_mode()
def test_invariant_linears_give_a_row_the_same_bits_whatever_shares_the_call(name, layer, dtype):
    """Row 0's output for batch sizes from one row to over two tiles, at
    the start, middle and end of the batch, with random neighbours."""
    gen = torch.Generator().manual_seed(1)
    pool = torch.randn(3 * INVARIANT_ROWS + 1, layer.in_features, generator=gen).to(dtype)
    row = pool[:1]
    expected = linear(layer, row, invariant=True)
    tile = INVARIANT_ROWS
    sizes = {1, 2, 3, 5, 8, 15, 16, 17, tile - 1, tile, tile + 1, 2 * tile + 3}
    for rows in sorted(sizes):
        for at in {0, rows // 2, rows - 1}:
            batch = torch.cat([pool[1:rows][:at], row, pool[1:rows][at:]])
            out = linear(layer, batch, invariant=True)
            assert torch.equal(out[at], expected[0]), f"{name}: {rows} rows, row at {at}"
