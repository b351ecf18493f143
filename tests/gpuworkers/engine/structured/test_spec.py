"""structured_output specs, their checks and the compiled-grammar cache
(the demo tokenizer, no model)."""

import pytest
import torch

from gpuworkers.engine import InvalidSamplingParams, SamplingParams
from gpuworkers.engine.sampling.grammar import apply_grammars
from gpuworkers.engine.scheduling.batch import SampleInput
from gpuworkers.engine.structured import GrammarCompiler, normalize

VOCAB = 49152
PERSON = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 8}},
    "required": ["name"],
}


@pytest.fixture(scope="module")
def compiler(tokenizer):
    return GrammarCompiler(tokenizer, VOCAB, [tokenizer.eos_token_id], capacity=2)


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({"type": "xml"}, "type must be one of"),
        ({"type": "json_object", "schema": {}}, "has no field 'schema'"),
        ({"type": "json_schema"}, "needs 'schema'"),
        ({"type": "json_schema", "schema": True}, "needs 'schema'"),
        ({"type": "json_schema", "schema": {"type": "objec"}}, "Invalid type: objec"),
        ({"type": "json_schema", "schema": {"$ref": "#/nowhere"}}, "does not exist"),
        (
            {
                "type": "json_schema",
                "schema": {
                    "type": "object",
                    "properties": {"a": {"type": "integer", "minimum": 5, "maximum": 1}},
                    "required": ["a"],
                },
            },
            "unsatisfiable",
        ),
        ({"type": "json_schema", "schema": {}, "strict": "yes"}, "'strict' must be"),
        ({"type": "regex", "pattern": "[a-z"}, "unclosed"),
        ({"type": "grammar", "grammar": "start: nowhere"}, "unknown name"),
    ],
)
def test_bad_specs_are_refused_with_the_compiler_message(spec, message):
    with pytest.raises(InvalidSamplingParams, match=message) as raised:
        SamplingParams(structured_output=spec)
    assert raised.value.param == "structured_output"


def test_strict_refuses_keywords_the_grammar_cannot_enforce():
    schema = {"type": "array", "items": {"type": "integer"}, "uniqueItems": True}
    with pytest.raises(InvalidSamplingParams, match="uniqueItems"):
        normalize({"type": "json_schema", "schema": schema, "strict": True})
    lenient = normalize({"type": "json_schema", "schema": schema})
    assert lenient["strict"] is False


def test_tool_call_shapes_compile(compiler):
    """anyOf, const, enum and bounded arrays (what tool_choice sends)."""
    call = {
        "type": "object",
        "properties": {"name": {"const": "get_weather"}, "parameters": {"enum": [1, 2]}},
        "required": ["name", "parameters"],
    }
    schema = {"type": "array", "minItems": 1, "maxItems": 2, "items": {"anyOf": [call, PERSON]}}
    state = compiler.compile({"type": "json_schema", "schema": schema}).new_state()
    text = '[{"name":"get_weather","parameters":2}]'
    tokens = compiler.hf_tokenizer.encode(text, add_special_tokens=False)
    # Only the closing bracket completes the grammar (and ends the choice).
    assert [state.advance(t) for t in tokens] == [False] * (len(tokens) - 1) + [True]
    assert state.is_complete


def test_one_compile_per_schema_text_and_least_recent_evicted(compiler):
    compiler._cache.clear()
    misses = compiler.misses
    first = compiler.compile({"type": "json_schema", "schema": PERSON})
    # Whitespace and the default strict do not make another grammar.
    again = compiler.compile({"type": "json_schema", "schema": dict(PERSON), "strict": False})
    assert again is first and compiler.misses == misses + 1
    compiler.compile({"type": "json_object"})
    compiler.compile({"type": "regex", "pattern": "[0-9]+"})
    assert len(compiler) == 2
    assert compiler.compile({"type": "json_schema", "schema": PERSON}) is not first


def test_a_grammar_naming_a_token_the_model_lacks_fails_on_compile(compiler):
    """The web tier cannot see the vocabulary; the engine's compile can."""
    spec = {"type": "grammar", "grammar": "start: <[999999]>"}
    assert normalize(spec) == spec
    with pytest.raises(InvalidSamplingParams, match="999999") as raised:
        compiler.compile(spec)
    assert raised.value.param == "structured_output"


def test_the_mask_touches_only_constrained_rows(compiler, tokenizer):
    """Row 1 keeps exactly the grammar's tokens; rows 0 and 2 are untouched."""
    state = compiler.compile({"type": "regex", "pattern": "(yes|no)"}).new_state()
    params = SamplingParams(temperature=0.0)
    samples = [SampleInput(i, i, params) for i in range(3)]
    samples[1].grammar = state
    logits = torch.randn(3, VOCAB, generator=torch.Generator().manual_seed(0))
    scores = apply_grammars(logits.clone(), samples)
    assert torch.equal(scores[0], logits[0]) and torch.equal(scores[2], logits[2])
    allowed = torch.isfinite(scores[1]).nonzero().flatten().tolist()
    texts = {tokenizer.decode([t]) for t in allowed}
    assert texts and all("yes".startswith(t) or "no".startswith(t) for t in texts), texts
    assert tokenizer.encode("yes", add_special_tokens=False)[0] in allowed
    assert torch.equal(scores[1][allowed], logits[1][allowed])
