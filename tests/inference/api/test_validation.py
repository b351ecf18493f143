"""Bad parameters are 400 invalid_request_error naming the param, before any GPU work."""

import json

import pytest

from fleet.services import served_model_register
from tests.plugins.request_path import DEMO, auth

pytestmark = pytest.mark.django_db

HI = [{"role": "user", "content": "hi"}]


def post(client, key, **fields):
    body = {"model": DEMO, "messages": HI, **fields}
    return client.post(
        "/v1/chat/completions", json.dumps(body), content_type="application/json", **auth(key)
    )


@pytest.mark.parametrize(
    "fields, param, code",
    [
        ({"n": 9}, "n", "value_above_max_value"),
        ({"n": 0}, "n", "value_below_min_value"),
        ({"logprobs": True, "top_logprobs": 21}, "top_logprobs", "value_above_max_value"),
        ({"top_logprobs": 2}, "top_logprobs", "invalid_value"),
        ({"stop": ["a", "b", "c", "d", "e"]}, "stop", "array_above_max_length"),
        ({"stop": [""]}, "stop", "empty_string"),
        (
            {"messages": [{"role": "tool", "content": "x"}]},
            "messages[0].tool_call_id",
            "missing_required_parameter",
        ),
        ({"messages": [{"role": "user"}]}, "messages[0].content", "missing_required_parameter"),
        (
            {"messages": [{"role": "user", "content": [{"type": "image_url", "text": "x"}]}]},
            "messages[0].content",
            "invalid_value",
        ),
        ({"messages": []}, "messages", "array_below_min_length"),
        ({"model": None}, "model", "invalid_type"),
        ({"temperature": 2.5}, "temperature", "value_above_max_value"),
        ({"top_p": -0.1}, "top_p", "value_below_min_value"),
        ({"max_tokens": 0}, "max_tokens", "value_below_min_value"),
        ({"max_tokens": -5}, "max_tokens", "value_below_min_value"),
        ({"max_tokens": 10**12}, "max_tokens", "integer_above_max_value"),
        ({"max_completion_tokens": 10**6}, "max_completion_tokens", "integer_above_max_value"),
        ({"max_tokens": 5, "max_completion_tokens": 6}, "max_tokens", "invalid_value"),
        ({"presence_penalty": 2.5}, "presence_penalty", "value_above_max_value"),
        ({"frequency_penalty": -2.1}, "frequency_penalty", "value_below_min_value"),
        ({"repetition_penalty": 0}, "repetition_penalty", "value_below_min_value"),
        ({"min_p": 1.5}, "min_p", "value_above_max_value"),
        ({"top_k": -2}, "top_k", "value_below_min_value"),
        ({"logit_bias": {"5": 101}}, "logit_bias.5", "value_above_max_value"),
        ({"logit_bias": {"five": 1}}, "logit_bias", "invalid_value"),
        ({"logit_bias": {"-3": 1}}, "logit_bias", "invalid_value"),
        ({"logit_bias": {"99999999": 1}}, "logit_bias", "invalid_value"),
        ({"stop_token_ids": [2**40]}, "stop_token_ids[0]", "value_above_max_value"),
        ({"stop_token_ids": [49152]}, "stop_token_ids", "invalid_value"),
        ({"bad_words": [""]}, "bad_words[0]", "empty_string"),
        ({"bad_words": ["x"] * 17}, "bad_words", "array_above_max_length"),
        ({"prompt_logprobs": 21}, "prompt_logprobs", "value_above_max_value"),
        ({"prompt_logprobs": 1, "stream": True}, "prompt_logprobs", "invalid_value"),
        ({"min_tokens": 9, "max_tokens": 8}, "min_tokens", "invalid_value"),
        ({"ignore_eos": "yes"}, "ignore_eos", "invalid_type"),
        ({"stream_options": {"include_usage": True}}, "stream_options", "invalid_value"),
        (
            {"stream": True, "stream_options": {"other": 1}},
            "stream_options.other",
            "unknown_parameter",
        ),
        ({"tools": []}, "tools", "array_below_min_length"),
        ({"seed": 2**64}, "seed", "value_above_max_value"),
        ({"n": "two"}, "n", "invalid_type"),
    ],
)
def test_bad_param_is_400_naming_it(client, pro_key, fields, param, code):
    response = post(client, pro_key, **fields)
    assert response.status_code == 400, response.content
    error = json.loads(response.content)["error"]
    assert (error["type"], error["param"], error["code"]) == ("invalid_request_error", param, code)
    assert error["message"]


def test_zero_penalties_and_none_values_are_accepted_by_validation(client, pro_key, memory_bus):
    """Clients that send defaults explicitly pass validation (then 503: no worker here)."""
    response = post(
        client, pro_key, presence_penalty=0, frequency_penalty=0.0, temperature=None, user="u1"
    )
    assert response.status_code == 503
    assert json.loads(response.content)["error"]["code"] == "no_worker_available"


def test_vllm_sampling_parameters_reach_the_worker_in_engine_terms(client, pro_key, fake_worker):
    """OpenAI's and vLLM's names in, the wire's Sampling (the engine's fields) out."""
    worker = fake_worker()
    response = post(
        client,
        pro_key,
        max_tokens=12,
        presence_penalty=0.5,
        frequency_penalty=-0.25,
        logit_bias={"42": -100, "7": 3.5},
        top_k=-1,
        min_p=0.05,
        repetition_penalty=1.2,
        min_tokens=4,
        ignore_eos=True,
        stop_token_ids=[2],
        bad_words=["darn"],
        include_stop_str_in_output=True,
        skip_special_tokens=False,
        prompt_logprobs=2,
        deterministic=True,
    )
    assert response.status_code == 200, response.content
    (request,) = worker.received
    s = request.sampling
    assert (s.presence_penalty, s.frequency_penalty, s.top_k) == (0.5, -0.25, 0)
    assert s.logit_bias == {42: -100.0, 7: 3.5}
    assert (s.min_p, s.repetition_penalty, s.min_tokens) == (0.05, 1.2, 4)
    assert s.ignore_eos and s.include_stop_str_in_output
    assert s.skip_special_tokens is False
    assert (s.stop_token_ids, s.bad_words) == ((2,), ("darn",))
    assert (s.prompt_logprobs, s.deterministic) == (2, True)
    # What the worker builds from it is the engine's own type, field for field.
    from gpuworkers.sampling import sampling_params

    params = sampling_params(s)
    assert params.logit_bias == {42: -100.0, 7: 3.5}
    assert (params.stop_token_ids, params.bad_words) == ([2], ["darn"])


def test_prompt_over_the_context_cap_is_context_length_exceeded(client, pro_key, tiers):
    """prompt + max_tokens over min(tier cap, model context): 400 context_length_exceeded."""
    served_model_register(name="tiny-context", context_length=48)
    response = client.post(
        "/v1/chat/completions",
        json.dumps(
            {"model": "tiny-context", "messages": [{"role": "user", "content": "word " * 60}]}
        ),
        content_type="application/json",
        **auth(pro_key),
    )
    assert response.status_code == 400
    error = json.loads(response.content)["error"]
    assert (error["code"], error["param"]) == ("context_length_exceeded", "messages")
    assert "maximum context length is 48 tokens" in error["message"]


def test_max_tokens_that_overflow_the_context_are_context_length_exceeded(client, pro_key, tiers):
    served_model_register(name="small-context", context_length=64)
    response = client.post(
        "/v1/chat/completions",
        json.dumps({"model": "small-context", "messages": HI, "max_tokens": 60}),
        content_type="application/json",
        **auth(pro_key),
    )
    assert response.status_code == 400
    assert json.loads(response.content)["error"]["code"] == "context_length_exceeded"


@pytest.mark.parametrize("fields, param", [({"n": "2"}, "n"), ({"stream": "true"}, "stream")])
def test_numbers_and_booleans_as_strings_are_rejected(client, pro_key, fields, param):
    """Validation is strict, like OpenAI's: no silent coercion of strings."""
    response = post(client, pro_key, **fields)
    assert response.status_code == 400
    assert json.loads(response.content)["error"]["param"] == param
