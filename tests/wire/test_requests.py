"""GenerationRequest across versions: the trace fields are optional both ways."""

from wire.requests import GenerationRequest


def test_a_payload_without_the_trace_fields_still_loads():
    """An older web tier's request: traceparent and request_id default to None."""
    old = {"response_id": "r1", "model": "m", "prompt_token_ids": [1, 2], "sampling": {}}
    request = GenerationRequest.from_dict(old)
    assert (request.traceparent, request.request_id) == (None, None)
    assert request.prompt_token_ids == [1, 2]


def test_fields_a_newer_web_tier_adds_are_ignored():
    new = GenerationRequest("r2", "m", [3], {"max_tokens": 4}, request_id="req_1").to_dict()
    new["added_in_a_later_version"] = True
    request = GenerationRequest.from_dict(new)
    assert request.request_id == "req_1" and request.sampling == {"max_tokens": 4}


def test_the_trace_context_survives_the_round_trip():
    traceparent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    request = GenerationRequest("r3", "m", [1], {}, traceparent=traceparent, request_id="req_2")
    assert GenerationRequest.from_dict(request.to_dict()) == request
