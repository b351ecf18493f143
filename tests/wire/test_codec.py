"""wire.codec: every record crosses as the JSON it always had, and back.

The JSON shapes are the stream contract's (workers and web processes of two
releases read each other's messages during a rolling deploy), so these
tests pin the shapes, not only the round trip.
"""

from __future__ import annotations

import json

import pytest

from wire.codec import (
    UndecodableMessage,
    decode_event,
    decode_request,
    encode_event,
    encode_event_without_seq,
    encode_request,
)
from wire.events import (
    ChoiceDelta,
    Created,
    Delta,
    ErrorInfo,
    EventType,
    PromptLogprob,
    Terminal,
    Timings,
    TokenLogprob,
    TokenUsage,
    TopLogprob,
)
from wire.requests import GenerationRequest, ServiceClass
from wire.sampling import Sampling
from wire.usage import UsageTag

LOGPROB = TokenLogprob("Hi", -0.25, (72, 105), (TopLogprob("Hey", -1.5, (72, 101, 121)),))
EVENTS = [
    Created(response_id="r", model="m", worker_id="w", prompt_tokens=5, created=1_700_000_000),
    Delta(
        2,
        (ChoiceDelta(0, "Hi", (13,), (LOGPROB,)), ChoiceDelta(1, " x", (14, 15), None, "length")),
        prompt_logprobs=(None, (PromptLogprob(9, -0.5, None, "a"), PromptLogprob(3, -0.1, 1, "b"))),
    ),
    Terminal(
        EventType.COMPLETED,
        3,
        TokenUsage(5, 3, 2),
        Timings(1.5, 20.0, 31.25),
        finish_reasons={0: "stop", 1: "length"},
    ),
    Terminal(EventType.FAILED, 4, error=ErrorInfo("lost", code="worker_lost")),
]


@pytest.mark.parametrize("event", EVENTS, ids=lambda e: e.type.value)
def test_every_event_survives_the_round_trip(event):
    assert decode_event(encode_event(event)) == event


def test_the_json_is_the_stream_contracts():
    created, delta, completed, failed = (json.loads(encode_event(e)) for e in EVENTS)
    assert created == {
        "type": "created",
        "seq": 1,
        "response_id": "r",
        "model": "m",
        "worker_id": "w",
        "created": 1_700_000_000,
        "prompt_tokens": 5,
    }
    assert delta["choices"][0] == {
        "index": 0,
        "text": "Hi",
        "token_ids": [13],
        "logprobs": [
            {
                "token": "Hi",
                "logprob": -0.25,
                "bytes": [72, 105],
                "top_logprobs": [{"token": "Hey", "logprob": -1.5, "bytes": [72, 101, 121]}],
            }
        ],
        "finish_reason": None,
    }
    # vLLM's prompt_logprobs: the prompt's own token first, keyed by token id.
    assert delta["prompt_logprobs"] == [
        None,
        {
            "9": {"logprob": -0.5, "rank": None, "decoded_token": "a"},
            "3": {"logprob": -0.1, "rank": 1, "decoded_token": "b"},
        },
    ]
    assert completed["usage"] == {"prompt_tokens": 5, "completion_tokens": 3, "cached_tokens": 2}
    assert completed["metrics"] == {"queue_time_ms": 1.5, "ttft_ms": 20.0, "duration_ms": 31.25}
    assert completed["finish_reasons"] == {"0": "stop", "1": "length"}
    assert failed["error"] == {
        "message": "lost",
        "type": "server_error",
        "param": None,
        "code": "worker_lost",
    }


def test_a_bus_that_numbers_endings_gets_the_json_without_seq():
    """Bus.publish_if_open's Lua script prepends the seq it chose."""
    text = encode_event_without_seq(EVENTS[3])
    assert text.startswith('{"type":"failed",') and '"seq"' not in text
    assert decode_event('{"seq":9,' + text[1:]) == Terminal(
        EventType.FAILED, 9, error=ErrorInfo("lost", code="worker_lost")
    )


def test_an_older_senders_event_takes_defaults_and_a_newer_ones_fields_are_ignored():
    old = {"type": "cancelled", "seq": 3, "usage": {"prompt_tokens": 2}}
    assert decode_event(json.dumps(old)) == Terminal(
        EventType.CANCELLED, 3, TokenUsage(prompt_tokens=2)
    )
    new = {"type": "delta", "seq": 2, "choices": [{"index": 0, "text": "a", "new": 1}], "x": 2}
    assert decode_event(json.dumps(new)) == Delta(2, (ChoiceDelta(0, "a"),))


@pytest.mark.parametrize("text", ['{"type": "exploded", "seq": 1}', "[1]", "not json", "{}"])
def test_anything_else_on_a_stream_is_refused_by_name(text):
    with pytest.raises(UndecodableMessage):
        decode_event(text)


def test_a_request_survives_the_round_trip_with_its_sampling_and_tag():
    traceparent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    request = GenerationRequest(
        "r3",
        "m",
        [1, 2],
        Sampling(max_tokens=8, stop=("\n",), logit_bias={50: -100.0}, n=2),
        tier="pro",
        tenant_id=7,
        service_class=ServiceClass.FLEX,
        traceparent=traceparent,
        request_id="req_2",
        usage_tag=UsageTag(api_key_id=3, source="api", tier_id=2),
    )
    assert decode_request(encode_request(request)) == request
    body = json.loads(encode_request(request))
    # Token ids are JSON object keys, hence strings, on the wire.
    assert body["sampling"]["logit_bias"] == {"50": -100.0}
    assert (body["service_class"], body["usage_tag"]["api_key_id"]) == ("flex", 3)


def test_an_older_web_tiers_request_still_loads():
    """No trace fields, no service class, no tag; sampling as SamplingParams' dict."""
    old = {
        "response_id": "r1",
        "model": "m",
        "prompt_token_ids": [1, 2],
        "sampling": {"max_tokens": 4, "stop": "\n", "logit_bias": {"7": 1}},
    }
    request = decode_request(json.dumps(old))
    assert (request.traceparent, request.request_id, request.usage_tag) == (None, None, None)
    assert request.service_class == ServiceClass.DEFAULT
    assert request.sampling == Sampling(max_tokens=4, stop=("\n",), logit_bias={7: 1.0})


def test_fields_a_newer_web_tier_adds_are_ignored():
    body = json.loads(encode_request(GenerationRequest("r2", "m", [3], Sampling(max_tokens=4))))
    body["added_in_a_later_version"] = True
    body["sampling"]["a_new_knob"] = 1
    request = decode_request(json.dumps(body))
    assert request.sampling == Sampling(max_tokens=4)
