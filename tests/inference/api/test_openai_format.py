"""Event -> OpenAI payload mapping, without I/O."""

from inference.api.openai_format import ChunkStream, CompletionBuilder, UsageLedger, token_logprobs
from wire.events import (
    EventType,
    created_event,
    delta_event,
    error_body,
    terminal_event,
    usage_body,
)


def stream(n=1, include_usage=False) -> ChunkStream:
    return ChunkStream("chatcmpl-x", "m", 123, n, include_usage)


def choice(index, text, ids, reason=None, logprobs=None):
    return {
        "index": index,
        "text": text,
        "token_ids": ids,
        "logprobs": logprobs,
        "finish_reason": reason,
    }


def created():
    return created_event(response_id="chatcmpl-x", model="m", worker_id="w", prompt_tokens=10)


def test_ledger_counts_tokens_when_the_terminal_carries_none():
    """A failed ending synthesized without usage still bills the tokens already sent."""
    ledger = UsageLedger()
    ledger.add(created())
    ledger.add(delta_event(2, [choice(0, "a", [1, 2]), choice(1, "b", [3])]))
    failed = terminal_event(EventType.FAILED, 3, error=error_body("lost"))
    summary = ledger.summary(failed)
    assert (summary.prompt_tokens, summary.completion_tokens) == (10, 3)
    assert (summary.status, summary.finish_reason) == ("failed", "error")


def test_ledger_prefers_the_workers_usage_and_clamps_cached_tokens():
    ledger = UsageLedger()
    ledger.add(created())
    done = terminal_event(
        EventType.COMPLETED,
        2,
        usage=usage_body(prompt_tokens=10, completion_tokens=4, cached_tokens=99),
        finish_reasons={"0": "stop"},
    )
    summary = ledger.summary(done)
    assert (summary.completion_tokens, summary.cached_tokens, summary.finish_reason) == (
        4,
        10,
        "stop",
    )


def test_engine_style_logprobs_are_converted():
    content = token_logprobs(
        [{"token_id": 5, "token": "é", "logprob": -0.5, "top": [[5, "é", -0.5], [6, "e", -1.0]]}]
    )
    assert content == [
        {
            "token": "é",
            "logprob": -0.5,
            "bytes": [195, 169],
            "top_logprobs": [
                {"token": "é", "logprob": -0.5, "bytes": [195, 169]},
                {"token": "e", "logprob": -1.0, "bytes": [101]},
            ],
        }
    ]


def test_incomplete_ending_sends_content_filter_once_for_unfinished_choices():
    chunks = stream(n=2)
    chunks.payloads(created())
    chunks.payloads(delta_event(2, [choice(0, "a", [1], "stop"), choice(1, "b", [2])]))
    (final,) = chunks.payloads(terminal_event(EventType.INCOMPLETE, 3))
    assert [(c["index"], c["finish_reason"]) for c in final["choices"]] == [(1, "content_filter")]


def test_cancelled_ending_is_an_error_payload():
    chunks = stream()
    chunks.payloads(created())
    (payload,) = chunks.payloads(terminal_event(EventType.CANCELLED, 2))
    assert payload["error"]["code"] == "cancelled"


def test_empty_deltas_produce_no_chunk():
    """Tokens held back by the detokenizer (no text yet) are not sent as empty chunks."""
    chunks = stream()
    chunks.payloads(created())
    assert chunks.payloads(delta_event(2, [choice(0, "", [7])])) == []


def test_completion_builder_joins_text_and_logprobs_per_choice():
    builder = CompletionBuilder("chatcmpl-x", "m", 123, 2, True)
    lp = [{"token": "a", "logprob": -0.1, "bytes": [97], "top_logprobs": []}]
    for event in (
        created(),
        delta_event(2, [choice(0, "Hel", [1], logprobs=lp), choice(1, "Yo", [2], logprobs=lp)]),
        delta_event(3, [choice(0, "lo", [3], "stop", logprobs=lp)]),
    ):
        builder.add(event)
    done = terminal_event(
        EventType.COMPLETED,
        4,
        usage=usage_body(prompt_tokens=10, completion_tokens=3),
        finish_reasons={"0": "stop", "1": "length"},
    )
    result = builder.result(done)
    assert [c["message"]["content"] for c in result["choices"]] == ["Hello", "Yo"]
    assert [c["finish_reason"] for c in result["choices"]] == ["stop", "length"]
    assert len(result["choices"][0]["logprobs"]["content"]) == 2
    assert result["usage"]["total_tokens"] == 13
