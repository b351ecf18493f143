"""The ``structured_output`` sampling field: shapes, checks, grammars.

Plain JSON, exactly as the wire request's ``sampling`` dict carries it::

    {"type": "json_object"}
    {"type": "json_schema", "schema": {...}, "strict": bool}
    {"type": "regex", "pattern": "..."}
    {"type": "grammar", "grammar": "..."}     (Lark syntax, llguidance's)

``strict`` follows OpenAI's meaning for what the schema may say: true
refuses keywords the grammar cannot enforce (``uniqueItems``, ``not``,
unknown formats), false ignores them. Either way the output follows every
keyword that is enforced.
"""

from __future__ import annotations

import json

from sampling_rules.errors import InvalidSamplingParams

PARAM = "structured_output"
# A schema is compiled into a grammar per distinct text; bound the work
# one request can ask for.
MAX_SPEC_CHARS = 64 * 1024
# Compact JSON: with a free choice of whitespace a small model can emit
# newlines until max_tokens; OpenAI's own output has none between tokens.
JSON_OPTIONS = {"whitespace_flexible": False, "item_separator": ",", "key_separator": ":"}
_FIELDS = {
    "json_object": {"type"},
    "json_schema": {"type", "schema", "strict"},
    "regex": {"type", "pattern"},
    "grammar": {"type", "grammar"},
}


def _fail(message: str) -> InvalidSamplingParams:
    return InvalidSamplingParams(PARAM, message)


def normalize(spec) -> dict | None:
    """The spec with defaults filled in (``strict`` false), checked and its
    grammar validated; None stays None.

    Raises:
        InvalidSamplingParams: (param ``structured_output``) an unknown
            type or field, a schema that is not a JSON object, or one the
            grammar compiler refuses, with its message.
    """
    if spec is None:
        return None
    if not isinstance(spec, dict) or spec.get("type") not in _FIELDS:
        raise _fail(f"structured_output type must be one of {', '.join(_FIELDS)}")
    kind = spec["type"]
    unknown = set(spec) - _FIELDS[kind]
    if unknown:
        raise _fail(f"structured_output of type {kind} has no field {sorted(unknown)[0]!r}")
    spec = dict(spec)
    if kind == "json_schema":
        if not isinstance(spec.get("schema"), dict):
            raise _fail("a json_schema needs 'schema', a JSON Schema object")
        spec["strict"] = spec.get("strict", False)
        if not isinstance(spec["strict"], bool):
            raise _fail("json_schema 'strict' must be true or false")
    elif kind in ("regex", "grammar"):
        field = "pattern" if kind == "regex" else "grammar"
        if not isinstance(spec.get(field), str) or not spec[field]:
            raise _fail(f"a {kind} needs '{field}', a non-empty string")
    if len(canonical_key(spec)) > MAX_SPEC_CHARS:
        raise _fail(f"structured_output may be at most {MAX_SPEC_CHARS} characters of JSON")
    check(grammar_for(spec))
    return spec


def canonical_key(spec: dict) -> str:
    """The cache key: the spec's JSON without whitespace. Keys keep their
    order: properties come out in schema order, so two orders are two
    grammars."""
    return json.dumps(spec, separators=(",", ":"), ensure_ascii=False)


def grammar_for(spec: dict) -> str:
    """llguidance's grammar text for a normalized spec."""
    from llguidance import LLMatcher

    kind = spec["type"]
    if kind == "regex":
        return LLMatcher.grammar_from_regex(spec["pattern"])
    if kind == "grammar":
        return LLMatcher.grammar_from_lark(spec["grammar"])
    schema = spec["schema"] if kind == "json_schema" else {"type": "object"}
    options = {**JSON_OPTIONS, "lenient": not spec.get("strict", False)}
    try:
        return LLMatcher.grammar_from_json_schema(schema, defaults=options)
    except ValueError as exc:
        raise _fail(f"invalid JSON schema: {exc}") from None


def check(grammar: str, tokenizer=None) -> None:
    """Raise InvalidSamplingParams with the compiler's message if the
    grammar is invalid (unsatisfiable, a bad $ref or regex, an unsupported
    keyword under strict)."""
    from llguidance import LLMatcher

    is_error, messages = LLMatcher.validate_grammar_with_warnings(grammar, tokenizer)
    if is_error:
        raise _fail(f"the grammar does not compile: {messages[0].strip()}")
