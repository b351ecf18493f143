"""The request path up to the bus: admission, dispatch, and the relay after.

``generation_start`` is the one call every surface makes, with the
``InferenceRequest`` it built from its own schema (``inference.request``):
model access, the prompt's safety screen, prompt preparation
(``inference.prompts``: chat template or plain text, context cap, output
cap), the claims on the tenant's limits, dispatch to a worker, then a
``ResponseTap`` that reads the response's events and settles its usage
whether or not the client stays connected. Checks that must run before any
GPU work (quotas, rate limits, admission) belong in it, between prompt
preparation, which yields the token counts they need, and dispatch; they
can add response headers through ``ResponseTap.headers``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import replace

from asgiref.sync import sync_to_async
from django.conf import settings
from django.contrib.auth.base_user import AbstractBaseUser
from django.core.cache import cache
from redis.exceptions import RedisError

from billing.models import UsageRecord
from billing.services import price_multiplier_for
from fleet.models import ServedModel
from fleet.selectors import catalog_model_get, catalog_model_listed
from fleet.snapshot import asnapshot_current
from inference import metrics
from inference.admission import drain
from inference.admission.limits import (
    Admission,
    LeaseKeeper,
    limits_admit,
    limits_count,
    limits_release,
)
from inference.admission.queue_wait import FlexCapacityUnavailable, QueueWaitExceeded
from inference.admission.settlement import Settlement, usage_tag
from inference.errors import APIError, ModelNotFound, NotFound, ServiceUnavailable
from inference.moderation import PromptSafety, policy_get, prompt_screen, reply_guard
from inference.offload import offloaded
from inference.prompts.prepare import PreparedPrompt, prompt_prepare
from inference.relay.dispatch import ModelWarmingUp, NoWorkerAvailable, dispatch_request
from inference.relay.tap import ResponseRoute, ResponseTap, route_cache_key
from inference.request import ChatPrompt, InferenceRequest, new_response_id
from inference.selectors import response_route_get
from tenants.models import ApiKey, Tenant, Tier
from tenants.ratelimit import Ticket
from wire import logs
from wire.bus import BusUnavailable, get_bus
from wire.requests import GenerationRequest
from wire.tracing import tracer
from wire.usage import UsageTag

logger = logging.getLogger(__name__)


@drain.admitting
async def generation_start(
    *,
    request: InferenceRequest,
    tenant: Tenant,
    api_key: ApiKey | None = None,
    user: AbstractBaseUser | None = None,
) -> ResponseTap:
    """Admit one response for ``tenant`` and hand it to a worker.

    ``tenant`` (its tier loaded) is the one ``request`` names; the API
    calls with the request's key, the console with the signed-in user and
    no key, so only the tier's tenant-wide limits apply. Raises
    ModelNotFound, InvalidRequest (and ContextLengthExceeded), RateLimited /
    InsufficientQuota (with the x-ratelimit-* headers) and
    ServiceUnavailable (no ready worker, bus down). The returned tap is
    already reading the response's events and carries the rate-limit
    headers.
    """
    if request.tenant_id != tenant.pk:
        raise ValueError(f"request of tenant {request.tenant_id} started for {tenant.pk}")
    tier = tenant.tier
    # The control snapshot's catalog: no query on the request path, and no
    # thread either while the snapshot lists the model (the database, for a
    # model registered since its last publication, is asked in one).
    with tracer.start_as_current_span("model.lookup"):
        model = catalog_model_listed(await asnapshot_current(), name=request.model, tier=tier)
        if model is None:
            model = await sync_to_async(catalog_model_get)(name=request.model, tier=tier)
    # A key's allow-list narrows its tier's models; outside it the model is
    # as unknown as one the tier lacks.
    if model is None or (api_key is not None and not api_key.allows_model(model.name)):
        raise ModelNotFound(request.model)
    # Known now: every later log line and span of this request carries them.
    logs.bind(tenant=tenant.pk, model=model.name)
    # The request rate, before any work on the request: screening,
    # tokenizing and grammar compiles are not free for a key over its rate,
    # and a request refused below (too long, blocked) still spent one.
    api_key_id = api_key.pk if api_key is not None else None
    # A Batch API line is counted in windows of its own, not limited by
    # RPM, TPM or concurrency (tenants.ratelimit.batch_limits): batches
    # have their own bounds, the monthly quota and the budget still apply.
    ticket = Ticket.for_response(
        response_id=request.response_id,
        api_key_id=api_key_id,
        tenant_id=tenant.pk,
        batch=request.source == UsageRecord.Source.BATCH,
    )
    with tracer.start_as_current_span("limits.count"):
        counted = await limits_count(
            tenant=tenant, api_key=api_key, ticket=ticket, model=model.name
        )
    # Safety (issue 20): the prompt stage, before any tokens are claimed or
    # billed; a blocked prompt is a 400, PII may come back redacted. The
    # tokenizer runs alongside it (below).
    request, safety, prepared = await _screen_and_prepare(
        tenant=tenant, request=request, model=model, api_key=api_key, user=user
    )
    # The budget's worst-case hold, then rate limits and quotas (issue 17):
    # atomic claims before any GPU work, both given back if it goes no further.
    sampling = prepared.sampling
    with tracer.start_as_current_span("limits.admit"):
        admission = await limits_admit(
            tenant=tenant,
            api_key=api_key,
            ticket=ticket,
            model=model.name,
            prompt_tokens=len(prepared.prompt_token_ids),
            completion_tokens=sampling.n * sampling.max_tokens,
            service_tier=request.service_class.value,
            price_multiplier=price_multiplier_for(source=request.source),
        )
    # The request's place in its request window is where it was counted:
    # its remaining-requests header says so, so concurrent requests each
    # report the next one down (at admission the window may be fuller).
    decision = replace(
        admission.decision,
        remaining_requests=counted.remaining_requests,
        reset_requests_ms=counted.reset_requests_ms,
    )
    try:
        tag = usage_tag(
            admission,
            api_key_id=api_key_id,
            user_id=user.pk if user is not None else None,
            source=request.source,
            regenerated=request.regenerated,
            service_tier=request.service_class.value,
        )
        with request.trace.attached():
            tap = await _dispatch(tenant, request, model, prepared, admission, tag, safety)
    except BaseException as exc:
        # Never reached a worker: free the slot, refund the reservations.
        await limits_release(admission)
        if isinstance(exc, APIError):
            exc.headers = {**decision.headers(), **exc.headers}
        if isinstance(exc, QueueWaitExceeded):
            reason = (
                metrics.FLEX_CAPACITY
                if isinstance(exc, FlexCapacityUnavailable)
                else metrics.QUEUE_WAIT
            )
            metrics.request_refused(reason=reason, tier=tier.name, model=model.name)
        raise
    tap.headers.update(decision.headers())
    return tap


async def _screen_and_prepare(
    *,
    tenant: Tenant,
    request: InferenceRequest,
    model: ServedModel,
    api_key: ApiKey | None,
    user: AbstractBaseUser | None,
) -> tuple[InferenceRequest, PromptSafety, PreparedPrompt]:
    """The prompt's safety screen and its tokenization, at the same time.

    Both are CPU work in pool threads and neither needs the other's result
    unless the screen changes the prompt: run one after the other they were
    two hops in a row before the first token. The screen still decides
    first: its refusal (a 400 content_policy_violation) wins over any error
    of the tokenizer (context length), whose tokens are dropped; a prompt
    it redacted is tokenized again from the redacted texts.
    """
    tier = tenant.tier
    preparing = asyncio.create_task(_prepare(request, model, tier))
    try:
        with tracer.start_as_current_span("safety.screen"):
            screened, safety = await prompt_screen(
                tenant=tenant, request=request, model=model.name, api_key=api_key, user=user
            )
    except BaseException:
        await _discard(preparing)
        raise
    if screened.prompt is not request.prompt:
        await _discard(preparing)
        return screened, safety, await _prepare(screened, model, tier)
    return screened, safety, await preparing


async def _prepare(request: InferenceRequest, model: ServedModel, tier: Tier) -> PreparedPrompt:
    # Tokenizing is CPU work and needs no database: any pool thread will do.
    with tracer.start_as_current_span("prompt.prepare"):
        return await offloaded(prompt_prepare)(request=request, model=model, tier=tier)


async def _discard(task: asyncio.Task) -> None:
    """Wait out a task whose result is not wanted, its error included (a
    pool thread cannot be interrupted; its outcome must not go unobserved)."""
    task.cancel()
    await asyncio.wait([task])
    if not task.cancelled():
        task.exception()


async def _dispatch(
    tenant: Tenant,
    request: InferenceRequest,
    model: ServedModel,
    prepared: PreparedPrompt,
    admission: Admission,
    tag: UsageTag,
    safety: PromptSafety,
) -> ResponseTap:
    tier = tenant.tier
    generation = GenerationRequest(
        response_id=request.response_id,
        model=model.name,
        prompt_token_ids=prepared.prompt_token_ids,
        sampling=prepared.sampling,
        priority=tier.priority,
        tier=tier.name,
        tenant_id=tenant.pk,
        service_class=request.service_class,
        cache_salt=tenant.cache_salt,
        request_id=request.trace.request_id,
        usage_tag=tag,
    )
    try:
        worker = await dispatch_request(
            generation, routing_key=request.routing_key(), shadow_allowed=tenant.shadow_opt_in
        )
    except ModelWarmingUp as exc:
        raise ServiceUnavailable(
            str(exc), code="model_warming_up", retry_after=exc.retry_after
        ) from exc
    except NoWorkerAvailable as exc:
        raise ServiceUnavailable(str(exc), code="no_worker_available") from exc
    except BusUnavailable as exc:
        raise ServiceUnavailable(code="bus_unavailable") from exc
    prompt = request.prompt
    route = ResponseRoute(
        response_id=generation.response_id,
        tenant_id=tenant.pk,
        api_key_id=tag.api_key_id,
        model=model.name,
        worker_id=worker.worker_id,
        n=prepared.sampling.n,
        logprobs=prepared.sampling.logprobs,
        include_usage=request.include_usage,
        created=int(time.time()),
        prompt_tokens=len(prepared.prompt_token_ids),
        model_version=worker.version,
        tier=tier.name,
        tool_parsing=prompt.tool_parsing if isinstance(prompt, ChatPrompt) else None,
        service_tier=request.service_class.value,
    )
    with tracer.start_as_current_span("route.save"):
        await response_route_save(route=route)
    return ResponseTap.start(
        route,
        settlement=Settlement(admission, tag, created_at=generation.created_at),
        leases=LeaseKeeper(admission),
        sent_at=generation.created_at,
        guard=safety.reply_guard(route, sent_at=generation.created_at),
        prompt_token_ids=prepared.prompt_token_ids,
    )


@drain.admitting
async def chat_completion_resume(*, api_key: ApiKey, response_id: str) -> ResponseTap:
    """A reader of an earlier response's events, from its first one.

    Only the tenant that created the response may read it, for as long as
    its event stream is kept (RESPONSE_STREAM_TTL). The reader settles no
    usage (the original request's tap does) and leaving it aborts nothing.
    Each resume counts one request against the key's rate (it replays a
    whole stream, so it is work like any other request).
    """
    ticket = Ticket.for_response(
        response_id=new_response_id("resume"), api_key_id=api_key.pk, tenant_id=api_key.tenant_id
    )
    await limits_count(tenant=api_key.tenant, api_key=api_key, ticket=ticket)
    try:
        route = await response_route_get(response_id=response_id, tenant_id=api_key.tenant_id)
        alive = route is not None and bool(await get_bus().read_events(response_id, 0, 0))
    except (BusUnavailable, RedisError) as exc:
        raise ServiceUnavailable(code="bus_unavailable") from exc
    if not alive:
        raise NotFound(
            f"No response with id '{response_id}' is available to resume.", param="response_id"
        )
    # The owner's cut, replayed: the same policy cuts at the same event.
    policy = await policy_get(api_key.tenant)
    return ResponseTap.start(
        route, abort_on_abandon=False, guard=reply_guard(policy=policy, n=route.n)
    )


async def moderation_count(*, api_key: ApiKey) -> None:
    """Count a /v1/moderations call against the key's request rate (429 over it)."""
    ticket = Ticket.for_response(
        response_id=new_response_id("modr"), api_key_id=api_key.pk, tenant_id=api_key.tenant_id
    )
    await limits_count(tenant=api_key.tenant, api_key=api_key, ticket=ticket)


async def response_route_save(*, route: ResponseRoute) -> None:
    """Remember who owns a response and where it runs, for stream resumes.

    The route lives as long as the response's event stream. A cache outage
    only costs resumability, never the response itself.
    """
    try:
        await cache.aset(
            route_cache_key(route.response_id), route, timeout=settings.RESPONSE_STREAM_TTL
        )
    except Exception:
        logger.warning("Could not save the route of %s", route.response_id, exc_info=True)
