"""Grammar-constrained decoding on the float32 demo model: the output
parses and validates, whatever the sampling, batching and preemption."""

import json

import jsonschema_rs
import pytest

from gpuworkers.engine import InvalidSamplingParams, SamplingParams

# Small enough that the 135M model always finishes: every string is bounded.
PET = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 12},
        "species": {"enum": ["cat", "dog", "bird"]},
        "legs": {"type": "integer", "minimum": 0, "maximum": 8},
        "tags": {"type": "array", "items": {"enum": ["cute", "loud"]}, "maxItems": 2},
    },
    "required": ["name", "species", "legs", "tags"],
    "additionalProperties": False,
}
STRUCTURED = {"type": "json_schema", "schema": PET, "strict": True}
MAX_TOKENS = 64


@pytest.fixture(scope="module")
def pet_prompt(tokenizer):
    from tokenization.tokenizer import apply_chat_template

    return apply_chat_template(tokenizer, [{"role": "user", "content": "Describe a pet as JSON."}])


def assert_valid(choice):
    assert choice.finish_reason == "stop", choice.text
    jsonschema_rs.validate(PET, json.loads(choice.text))


def test_greedy_and_sampled_outputs_validate(make_engine, pet_prompt):
    engine = make_engine()
    params = [SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, structured_output=STRUCTURED)]
    params += [
        SamplingParams(
            max_tokens=MAX_TOKENS, temperature=1.0, seed=seed, structured_output=STRUCTURED
        )
        for seed in range(4)
    ]
    outputs = engine.generate([pet_prompt] * len(params), params)
    for output in outputs:
        assert_valid(output.choices[0])
    # The grammar ended each choice: nothing after the closing brace.
    assert all(o.choices[0].text.endswith("}") for o in outputs)
    assert len({o.choices[0].text for o in outputs}) > 1, "sampling still samples"
    assert engine.grammars.misses == 1
    assert engine.stats()["kv_blocks_used"] == 0


def test_unconstrained_neighbours_get_the_same_tokens(make_engine, chat_prompts, pet_prompt):
    """A constrained request in the batch changes nothing for the others:
    against the same batch with that request unconstrained (ignore_eos and
    one max_tokens keep the batch shape equal at every step)."""
    lowercase = {"type": "regex", "pattern": "[a-z ]{1,400}"}

    def run(structured):
        options = {"max_tokens": 24, "ignore_eos": True}
        params = [
            SamplingParams(temperature=0.0, **options),
            SamplingParams(temperature=1.0, seed=7, **options),
            SamplingParams(temperature=0.0, structured_output=structured, **options),
        ]
        prompts = [chat_prompts[1], chat_prompts[2], pet_prompt]
        return make_engine().generate(prompts, params)

    constrained, plain = run(lowercase), run(None)
    for i in (0, 1):
        assert constrained[i].choices[0].token_ids == plain[i].choices[0].token_ids
    text = constrained[2].choices[0].text
    assert len(constrained[2].choices[0].token_ids) == 24
    assert text and set(text) <= set("abcdefghijklmnopqrstuvwxyz ")
    assert plain[2].choices[0].text != text


def test_n2_choices_each_follow_the_grammar(make_engine, pet_prompt):
    params = SamplingParams(
        max_tokens=MAX_TOKENS, temperature=1.0, seed=11, n=2, structured_output=STRUCTURED
    )
    engine = make_engine()
    [output] = engine.generate([pet_prompt], params)
    assert [c.index for c in output.choices] == [0, 1]
    for choice in output.choices:
        assert_valid(choice)
    assert output.choices[0].text != output.choices[1].text


def test_recomputed_sequences_keep_their_grammar_state(make_engine, chat_prompts, pet_prompt):
    """A pool too small for the batch, no host pool: preempted sequences
    recompute prompt and output, and their masks carry on where they were."""
    engine = make_engine(
        num_kv_blocks=14, num_host_blocks=0, admission_policy="optimistic",
        enable_prefix_caching=False,
    )  # fmt: skip
    prompts = [pet_prompt, *chat_prompts[:3]]
    params = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, structured_output=STRUCTURED)
    outputs = engine.generate(prompts, params)
    assert engine.stats()["recomputes"] > 0
    for output in outputs:
        assert_valid(output.choices[0])
    assert engine.stats()["kv_blocks_used"] == 0


def test_a_grammar_the_engine_cannot_compile_is_refused_on_add(make_engine, pet_prompt):
    engine = make_engine()
    params = SamplingParams(structured_output={"type": "grammar", "grammar": "start: <[999999]>"})
    with pytest.raises(InvalidSamplingParams) as raised:
        engine.add_request("bad", pet_prompt, params)
    assert raised.value.param == "structured_output"
    assert not engine.has_unfinished_requests()
    assert engine.stats()["kv_blocks_used"] == 0 and not engine.scheduler.waiting
