"""Prompt preparation: chat template, context cap and the default output bound.

The requests are built the way the chat endpoint builds them
(``inference.api.chat.chat_request``), then prepared."""

import pytest

from fleet.selectors import served_model_dir
from fleet.services import served_model_register
from inference.api.chat import chat_request
from inference.api.schemas import ChatCompletionRequest
from inference.errors import ContextLengthExceeded, InvalidRequest, ServiceUnavailable
from inference.prompts.prepare import prompt_prepare
from tenants.models import Tenant
from tokenization.tokenizer import apply_chat_template, load_tokenizer

pytestmark = pytest.mark.django_db


def request(**fields) -> ChatCompletionRequest:
    fields.setdefault("messages", [{"role": "user", "content": "hi"}])
    return ChatCompletionRequest(model="m", **fields)


def chat_prompt_prepare(*, request, model, tier):
    """Prepare ``request`` (the chat schema) as the chat endpoint would."""
    tenant = Tenant(pk=1, tier=tier)
    return prompt_prepare(request=chat_request(request, tenant=tenant), model=model, tier=tier)


def template_ids(model, messages):
    return apply_chat_template(load_tokenizer(str(served_model_dir(model=model))), messages)


def test_prompt_uses_the_models_chat_template(demo_model, tiers):
    prepared = chat_prompt_prepare(
        request=request(
            messages=[
                {"role": "developer", "content": "Be brief."},
                {
                    "role": "user",
                    "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
                },
            ]
        ),
        model=demo_model,
        tier=tiers["pro"],
    )
    # developer is the template's system role; text parts are joined by newlines.
    expected = template_ids(
        demo_model,
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "a\nb"}],
    )
    assert prepared.prompt_token_ids == expected


def test_default_max_tokens_is_the_tier_cap_or_the_remaining_context(demo_model, tiers):
    pro = tiers["pro"]
    prepared = chat_prompt_prepare(request=request(), model=demo_model, tier=pro)
    assert prepared.sampling.max_tokens == pro.max_output_tokens
    small = served_model_register(name="small", context_length=100)
    prepared = chat_prompt_prepare(request=request(), model=small, tier=pro)
    assert prepared.sampling.max_tokens == 100 - len(prepared.prompt_token_ids)


def test_prompt_alone_over_the_cap_is_context_length_exceeded(tiers):
    small = served_model_register(name="small", context_length=20)
    with pytest.raises(ContextLengthExceeded) as caught:
        chat_prompt_prepare(
            request=request(messages=[{"role": "user", "content": "one two three " * 10}]),
            model=small,
            tier=tiers["pro"],
        )
    assert caught.value.param == "messages" and caught.value.status == 400


def test_tier_context_cap_applies_when_below_the_models(demo_model, tiers):
    """The free tier's 2048-token cap binds before the model's 8192."""
    free = tiers["free"]
    with pytest.raises(ContextLengthExceeded):
        chat_prompt_prepare(
            request=request(
                max_tokens=free.max_output_tokens,
                messages=[{"role": "user", "content": "hello " * 1800}],
            ),
            model=demo_model,
            tier=free,
        )


def test_max_completion_tokens_over_the_tier_output_cap_names_that_param(demo_model, tiers):
    with pytest.raises(InvalidRequest) as caught:
        chat_prompt_prepare(
            request=request(max_completion_tokens=10_000), model=demo_model, tier=tiers["pro"]
        )
    assert caught.value.param == "max_completion_tokens"


def test_sampling_carries_the_requests_settings(demo_model, tiers):
    prepared = chat_prompt_prepare(
        request=request(
            max_tokens=7,
            temperature=0.3,
            top_p=0.9,
            n=3,
            stop=["\n"],
            seed=11,
            logprobs=True,
            top_logprobs=2,
        ),
        model=demo_model,
        tier=tiers["pro"],
    )
    s = prepared.sampling
    assert (s.max_tokens, s.temperature, s.top_p, s.n, s.stop, s.seed) == (
        7,
        0.3,
        0.9,
        3,
        ("\n",),
        11,
    )
    assert (s.logprobs, s.top_logprobs) == (True, 2)


def test_top_p_zero_means_greedy(demo_model, tiers):
    """top_p -> 0 keeps only the most likely token: sent as temperature 0."""
    s = chat_prompt_prepare(request=request(top_p=0), model=demo_model, tier=tiers["pro"]).sampling
    assert (s.temperature, s.top_p) == (0.0, 1.0)


def test_served_model_register_updates_in_place(tiers):
    first = served_model_register(name="m1", context_length=100, tiers=[tiers["pro"]])
    again = served_model_register(name="m1", context_length=200)
    assert again.pk == first.pk and again.context_length == 200
    assert set(again.tiers.values_list("name", flat=True)) == {"free", "pro", "enterprise"}


def test_a_demo_model_not_converted_yet_is_a_503_and_no_conversion(
    demo_model, tiers, tmp_path, monkeypatch
):
    """The web tier reads tokenizer files only: before set-up (or the worker)
    converted the demo model, a request waits for it, it never converts."""
    monkeypatch.setenv("LLM_MODEL_CACHE", str(tmp_path))
    with pytest.raises(ServiceUnavailable) as caught:
        chat_prompt_prepare(request=request(), model=demo_model, tier=tiers["pro"])
    assert (caught.value.status, caught.value.code) == (503, "model_warming_up")
    assert "not converted yet" in caught.value.message
    assert list(tmp_path.iterdir()) == []
