"""Typed events -> OpenAI bodies, without I/O."""

from inference.api.openai_format import ChunkStream, CompletionBuilder, UsageLedger
from wire.events import (
    ChoiceDelta,
    Created,
    Delta,
    ErrorInfo,
    EventType,
    Terminal,
    TokenLogprob,
    TokenUsage,
    TopLogprob,
)


def stream(n=1, include_usage=False) -> ChunkStream:
    return ChunkStream("chatcmpl-x", "m", 123, n, include_usage)


def choice(index, text, ids, reason=None, logprobs=None) -> ChoiceDelta:
    return ChoiceDelta(index, text, tuple(ids), logprobs, reason)


def created() -> Created:
    return Created(response_id="chatcmpl-x", model="m", worker_id="w", prompt_tokens=10)


def test_ledger_counts_tokens_when_the_terminal_carries_none():
    """A failed ending synthesized without usage still bills the tokens already sent."""
    ledger = UsageLedger()
    ledger.add(created())
    ledger.add(Delta(2, (choice(0, "a", [1, 2]), choice(1, "b", [3]))))
    failed = Terminal(EventType.FAILED, 3, error=ErrorInfo("lost"))
    assert ledger.usage(failed) == TokenUsage(prompt_tokens=10, completion_tokens=3)


def test_ledger_prefers_the_workers_usage_and_clamps_cached_tokens():
    ledger = UsageLedger()
    ledger.add(created())
    done = Terminal(
        EventType.COMPLETED,
        2,
        usage=TokenUsage(prompt_tokens=10, completion_tokens=4, cached_tokens=99),
        finish_reasons={0: "stop"},
    )
    assert ledger.usage(done) == TokenUsage(prompt_tokens=10, completion_tokens=4, cached_tokens=10)


def test_logprobs_are_openais_content_items():
    logprob = TokenLogprob("é", -0.5, (195, 169), (TopLogprob("e", -1.0, (101,)),))
    chunks = stream()
    chunks.payloads(created())
    (chunk,) = chunks.payloads(Delta(2, (choice(0, "é", [5], logprobs=(logprob,)),)))[1:]
    assert chunk["choices"][0]["logprobs"]["content"] == [
        {
            "token": "é",
            "logprob": -0.5,
            "bytes": [195, 169],
            "top_logprobs": [{"token": "e", "logprob": -1.0, "bytes": [101]}],
        }
    ]


def test_incomplete_ending_sends_content_filter_once_for_unfinished_choices():
    chunks = stream(n=2)
    chunks.payloads(created())
    chunks.payloads(Delta(2, (choice(0, "a", [1], "stop"), choice(1, "b", [2]))))
    (final,) = chunks.payloads(Terminal(EventType.INCOMPLETE, 3))
    assert [(c["index"], c["finish_reason"]) for c in final["choices"]] == [(1, "content_filter")]


def test_cancelled_ending_is_an_error_payload():
    chunks = stream()
    chunks.payloads(created())
    (payload,) = chunks.payloads(Terminal(EventType.CANCELLED, 2))
    assert payload["error"]["code"] == "cancelled"


def test_a_failed_ending_carries_the_workers_error():
    chunks = stream()
    chunks.payloads(created())
    error = ErrorInfo("Prompt too long", type="invalid_request_error", code="prompt_too_long")
    (payload,) = chunks.payloads(Terminal(EventType.FAILED, 2, error=error))
    assert payload == {
        "error": {
            "message": "Prompt too long",
            "type": "invalid_request_error",
            "param": None,
            "code": "prompt_too_long",
        }
    }


def test_empty_deltas_produce_no_chunk():
    """Tokens held back by the detokenizer (no text yet) are not sent as empty chunks."""
    chunks = stream()
    chunks.payloads(created())
    assert chunks.payloads(Delta(2, (choice(0, "", [7]),))) == []


def test_completion_builder_joins_text_and_logprobs_per_choice():
    builder = CompletionBuilder("chatcmpl-x", "m", 123, 2, True)
    lp = (TokenLogprob("a", -0.1, (97,)),)
    for event in (
        created(),
        Delta(2, (choice(0, "Hel", [1], logprobs=lp), choice(1, "Yo", [2], logprobs=lp))),
        Delta(3, (choice(0, "lo", [3], "stop", logprobs=lp),)),
    ):
        builder.add(event)
    done = Terminal(
        EventType.COMPLETED,
        4,
        usage=TokenUsage(prompt_tokens=10, completion_tokens=3),
        finish_reasons={0: "stop", 1: "length"},
    )
    result = builder.result(done)
    assert [c["message"]["content"] for c in result["choices"]] == ["Hello", "Yo"]
    assert [c["finish_reason"] for c in result["choices"]] == ["stop", "length"]
    assert len(result["choices"][0]["logprobs"]["content"]) == 2
    assert result["usage"]["total_tokens"] == 13
