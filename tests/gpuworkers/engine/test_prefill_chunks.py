"""``LLMEngine.last_prefill_chunks``: the prompt positions each step computed
(the worker's per-chunk trace spans)."""

from gpuworkers.engine import SamplingParams


def test_chunks_cover_the_prompt_even_when_its_last_chunk_is_one_token(make_engine):
    """A 33-token prompt under a 16-token budget ends with a chunk of one
    token, which the batch carries as a decode row: it is a chunk all the same."""
    engine = make_engine(max_num_batched_tokens=16, enable_prefix_caching=False)
    prompt = list(range(100, 133))
    engine.add_request("r", prompt, SamplingParams(max_tokens=3, temperature=0.0))
    chunks = []
    while engine.has_unfinished_requests():
        engine.step()
        chunks += [positions for _, positions in engine.last_prefill_chunks]
    assert chunks == [range(0, 16), range(16, 32), range(32, 33)]
