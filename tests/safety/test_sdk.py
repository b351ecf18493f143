"""Safety through the official openai SDK, against the ASGI app and a scripted worker.

The worker's replies are scripted text (``TextWorker``), so a test decides
where the token boundaries fall; everything between the SDK and the bus is
the real request path (auth, prompt stage, limits, dispatch, relay).
"""

import json

import openai
import pytest
from asgiref.sync import sync_to_async

from billing.models import UsageRecord
from inference.relay import tap as relay
from safety.models import SafetyEvent
from safety.services import tenant_safety_policy_update
from tests.helpers import async_wait_until
from tests.plugins.asgi_client import asgi_get, sdk_client, sse_events
from tests.plugins.request_path import DEMO

pytestmark = [
    pytest.mark.asyncio,
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("close_db_threads", "demo_model"),
]

INSULT = "You are a fucking idiot and everyone knows it."


async def new_key(api_key_factory, **policy) -> tuple[str, int]:
    """A pro key of a new tenant, with ``policy`` as its safety choices."""

    def make():
        key, raw = api_key_factory(tier="pro")
        if policy:
            tenant_safety_policy_update(tenant=key.tenant, **policy)
        return raw, key.tenant_id

    return await sync_to_async(make)()


def events_of(tenant_id: int) -> list[SafetyEvent]:
    return list(SafetyEvent.objects.filter(tenant_id=tenant_id).order_by("id"))


async def test_a_blocked_prompt_is_a_400_before_any_worker_sees_it(fake_worker, api_key_factory):
    worker = fake_worker(texts=["Hello", " there"])
    raw, tenant_id = await new_key(api_key_factory)
    with pytest.raises(openai.BadRequestError) as error:
        await sdk_client(raw).chat.completions.create(
            model=DEMO, messages=[{"role": "user", "content": INSULT}]
        )
    assert error.value.status_code == 400
    assert error.value.code == "content_policy_violation"
    assert error.value.param == "messages"
    assert error.value.body["type"] == "invalid_request_error"
    assert worker.received == []
    await relay.drain_background()
    # Not billed, and no rate-limit reservation to settle: nothing was admitted.
    assert not await sync_to_async(UsageRecord.objects.filter(tenant_id=tenant_id).exists)()
    (event,) = await sync_to_async(events_of)(tenant_id)
    assert (event.stage, event.outcome) == ("prompt", "blocked")
    assert event.findings[0]["check"] == "classifier" and event.findings[0]["score"] > 0.8
    # The tenant did not opt in: a hash and a length, not the text.
    assert event.text == "" and len(event.text_sha256) == 64 and event.text_chars == len(INSULT)


async def test_a_reply_is_cut_with_content_filter_mid_stream_across_a_token_boundary(
    fake_worker, api_key_factory
):
    """The deny-listed phrase arrives as "bl" + "ue wh" + "ale": the client
    never gets "ale", the stream ends content_filter, the worker is told to
    abort (freeing its KV) while it still generates, and usage counts the
    three tokens that were sent."""
    texts = ["I saw a ", "bl", "ue wh", "ale", " today", " and", " then", " more", " text"]
    worker = fake_worker(texts=texts, interval=0.3)
    raw, tenant_id = await new_key(api_key_factory, deny_terms="blue whale", deny_action="block")
    stream = await sdk_client(raw).chat.completions.create(
        model=DEMO,
        messages=[{"role": "user", "content": "What did you see?"}],
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = [chunk async for chunk in stream]
    content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    reasons = [
        c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason
    ]
    assert content == "I saw a blue wh"
    assert reasons == ["content_filter"]
    assert chunks[-1].usage.completion_tokens == 3
    response_id = chunks[0].id
    await async_wait_until(lambda: response_id in worker.aborted, message="abort reached worker")
    # Cut long before the worker's nine tokens were done.
    assert response_id in worker.closed_under_me
    await relay.drain_background()
    record = await sync_to_async(UsageRecord.objects.get)(response_id=response_id)
    assert (record.status, record.finish_reason, record.completion_tokens) == (
        "incomplete",
        "content_filter",
        3,
    )
    (event,) = await sync_to_async(events_of)(tenant_id)
    assert (event.stage, event.outcome, event.request_ref) == ("output", "blocked", response_id)
    assert event.findings == [{"check": "deny_list", "category": "blue whale", "score": 1.0}]


async def test_the_classifier_cuts_a_reply_and_a_resume_shows_the_same_ending(
    fake_worker, api_key_factory
):
    texts = ["Sure.", " You are", " a fu", "cking", " idiot", " and", " more"]
    fake_worker(texts=texts)
    raw, _ = await new_key(api_key_factory)
    completion = await sdk_client(raw).chat.completions.create(
        model=DEMO, messages=[{"role": "user", "content": "Be honest."}]
    )
    choice = completion.choices[0]
    assert choice.finish_reason == "content_filter"
    assert choice.message.content == "Sure. You are a fu"
    assert completion.usage.completion_tokens == 3
    # A reader resuming the stream gets the frames the client got, no more.
    resumed = asgi_get(f"/v1/chat/completions/{completion.id}/events", raw)
    frames = [json.loads(d) for _, d in sse_events(await resumed.read_all()) if d != "[DONE]"]
    text = "".join(f["choices"][0]["delta"].get("content") or "" for f in frames if f["choices"])
    assert text == "Sure. You are a fu"
    assert frames[-1]["choices"][0]["finish_reason"] == "content_filter"


async def test_pii_is_redacted_before_the_model_sees_the_prompt(fake_worker, api_key_factory):
    from fleet.models import ServedModel
    from fleet.selectors import served_model_dir
    from tokenization.tokenizer import load_tokenizer

    worker = fake_worker(texts=["Done."])
    raw, tenant_id = await new_key(api_key_factory, store_text=True, pii_action="redact")
    prompt = "Email jane.doe@example.com or call 415-555-0132 about card 4111 1111 1111 1111."
    completion = await sdk_client(raw).chat.completions.create(
        model=DEMO, messages=[{"role": "user", "content": prompt}]
    )
    assert completion.choices[0].message.content == "Done."
    (request,) = worker.received
    model = await sync_to_async(ServedModel.objects.get)(name=DEMO)
    tokenizer = load_tokenizer(str(served_model_dir(model=model)))
    seen = tokenizer.decode(request.prompt_token_ids)
    assert "Email <EMAIL_ADDRESS> or call <PHONE_NUMBER> about card <CREDIT_CARD>." in seen
    assert "jane.doe" not in seen and "4111" not in seen and "555" not in seen
    (event,) = await sync_to_async(events_of)(tenant_id)
    assert event.outcome == "redacted"
    assert {f["category"] for f in event.findings} == {
        "EMAIL_ADDRESS",
        "PHONE_NUMBER",
        "CREDIT_CARD",
    }
    # Opted in: the text is kept, and never with its PII.
    assert "<EMAIL_ADDRESS>" in event.text and "jane.doe" not in event.text


async def test_a_deny_list_is_the_tenants_own(fake_worker, api_key_factory):
    worker = fake_worker(texts=["Noted."])
    raw_a, _ = await new_key(api_key_factory, deny_terms="Project Nightingale\nbluebird")
    raw_b, _ = await new_key(api_key_factory)
    messages = [{"role": "user", "content": "Status of project  nightingale?"}]
    with pytest.raises(openai.BadRequestError) as error:
        await sdk_client(raw_a).chat.completions.create(model=DEMO, messages=messages)
    assert error.value.code == "content_policy_violation"
    completion = await sdk_client(raw_b).chat.completions.create(model=DEMO, messages=messages)
    assert completion.choices[0].message.content == "Noted."
    assert len(worker.received) == 1


async def test_a_flag_only_policy_records_the_prompt_and_serves_it(fake_worker, api_key_factory):
    worker = fake_worker(texts=["Fine."])
    raw, tenant_id = await new_key(api_key_factory, classifier_action="flag")
    completion = await sdk_client(raw).chat.completions.create(
        model=DEMO, messages=[{"role": "user", "content": INSULT}]
    )
    assert completion.choices[0].finish_reason == "stop"
    assert len(worker.received) == 1
    (event,) = await sync_to_async(events_of)(tenant_id)
    assert (event.stage, event.outcome) == ("prompt", "flagged")


async def test_the_moderations_endpoint_uses_the_same_checks(memory_bus, api_key_factory):
    raw, _ = await new_key(api_key_factory, deny_terms="bluebird")
    client = sdk_client(raw)
    result = await client.moderations.create(
        model="omni-moderation-latest",
        input=[INSULT, "The weather is lovely today.", "mail me: a@b.example", "a Bluebird sang"],
    )
    assert result.model == "llmp-moderation-1" and result.id.startswith("modr-")
    insult, clean, pii, deny = result.results
    assert insult.flagged and insult.categories.harassment
    assert insult.category_scores.harassment > 0.9
    assert not clean.flagged and not clean.categories.harassment
    assert clean.category_scores.harassment < 0.5
    assert pii.flagged and pii.categories.model_extra["pii"] is True
    assert deny.flagged and deny.categories.model_extra["deny_list"] is True
    assert not deny.categories.harassment
    with pytest.raises(openai.NotFoundError):
        await client.moderations.create(model="no-such-moderator", input="hi")
