"""The request path up to the bus: admission, dispatch, usage.

``chat_completion_start`` is the one call an endpoint makes: model access,
prompt preparation (``inference.prompts.prepare``: chat template, context cap,
output cap), dispatch to a worker, then a ``ResponseTap`` that reads the
response's events and settles its usage whether or not the client stays
connected. Checks that must run
before any GPU work (quotas, rate limits, admission) belong in it, between
prompt preparation, which yields the token counts they need, and dispatch;
they can add response headers through ``ResponseTap.headers``.
"""

from __future__ import annotations

import functools
import logging
import time
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime

from asgiref.sync import sync_to_async
from django.conf import settings
from django.contrib.auth.base_user import AbstractBaseUser
from django.core.cache import cache
from django.db import DatabaseError
from redis.exceptions import RedisError

from billing.models import UsageRecord
from billing.services import usage_record_create
from fleet.fallback import db_mark_down, db_marked_down
from fleet.models import ServedModel
from fleet.routing import conversation_routing_key
from fleet.selectors import catalog_model_get
from inference import metrics
from inference.admission import drain
from inference.admission.limits import (
    Admission,
    LeaseKeeper,
    limits_admit,
    limits_release,
    limits_settle,
)
from inference.admission.queue_wait import QueueWaitExceeded
from inference.api.schemas import ChatCompletionRequest
from inference.errors import (
    APIError,
    ModelNotFound,
    NotFound,
    ServiceUnavailable,
)
from inference.moderation import PromptSafety, policy_get, prompt_screen, reply_guard
from inference.prompts.prepare import PreparedPrompt, PromptPreparer, chat_prompt_prepare
from inference.relay.dispatch import NoWorkerAvailable, dispatch_request
from inference.relay.tap import ResponseRoute, ResponseTap, UsageSummary, route_cache_key
from inference.selectors import response_route_get
from tenants.models import ApiKey, Tenant
from tenants.ratelimit import Ticket
from wire import logs
from wire.bus import BusUnavailable, get_bus
from wire.requests import GenerationRequest
from wire.usage import UsageEntry, UsageTag, get_usage_stream

logger = logging.getLogger(__name__)


def new_response_id(prefix: str = "chatcmpl") -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


async def chat_completion_start(
    *, api_key: ApiKey, request: ChatCompletionRequest, conversation_id: str | None = None
) -> ResponseTap:
    """The API's chat completion: ``completion_start`` on behalf of a key."""
    return await completion_start(
        tenant=api_key.tenant, request=request, api_key=api_key, conversation_id=conversation_id
    )


@dataclass(slots=True, frozen=True)
class Attribution:
    """Who a response's usage record names besides its tenant."""

    api_key_id: int | None
    user_id: int | None
    source: str
    regenerated: bool


@drain.admitting
async def completion_start(
    *,
    tenant: Tenant,
    request: ChatCompletionRequest,
    api_key: ApiKey | None = None,
    user: AbstractBaseUser | None = None,
    source: str = UsageRecord.Source.API,
    regenerated: bool = False,
    conversation_id: str | None = None,
    default_max_tokens: int | None = None,
    prepare: PromptPreparer = chat_prompt_prepare,
    id_prefix: str = "chatcmpl",
) -> ResponseTap:
    """Admit one chat completion for ``tenant`` and hand it to a worker.

    Every endpoint comes through here with a ``ChatCompletionRequest``
    (``messages`` are what moderation screens and routing keys on);
    ``prepare`` turns the screened request into prompt tokens and sampling
    (``chat_prompt_prepare``: the chat template). ``id_prefix`` names the
    response id's kind (chatcmpl, cmpl, resp).

    ``default_max_tokens`` bounds a completion whose request sets no
    max_tokens below the tier's output cap (the console's replies).

    ``conversation_id`` keeps a conversation's turns on the replica that
    holds its KV cache (``fleet.routing``).

    The API calls it with the request's key; the console with the signed-in
    user and no key, so only the tier's tenant-wide limits apply. ``tenant``
    must have its tier loaded. Raises ModelNotFound, InvalidRequest (and
    ContextLengthExceeded), RateLimited / InsufficientQuota (with the
    x-ratelimit-* headers) and ServiceUnavailable (no ready worker, bus
    down). The returned tap is already reading the response's events and
    carries the rate-limit headers.
    """
    tier = tenant.tier
    # The control snapshot's catalog: no query on the request path.
    model = await sync_to_async(catalog_model_get)(name=request.model, tier=tier)
    # A key's allow-list narrows its tier's models; outside it the model is
    # as unknown as one the tier lacks.
    if model is None or (api_key is not None and not api_key.allows_model(model.name)):
        raise ModelNotFound(request.model)
    # Known now: every later log line and span of this request carries them.
    logs.bind(tenant=tenant.pk, model=model.name)
    # Safety (issue 20): the prompt stage, before anything is counted or
    # billed; a blocked prompt is a 400, PII may come back redacted.
    request, safety = await prompt_screen(
        tenant=tenant, request=request, model=model.name, api_key=api_key, user=user, source=source
    )
    # Tokenizing is CPU work and needs no database: any pool thread will do.
    prepared = await sync_to_async(prepare, thread_sensitive=False)(
        request=request, model=model, tier=tier, default_max_tokens=default_max_tokens
    )
    # The budget's worst-case hold, then rate limits and quotas (issue 17):
    # atomic claims before any GPU work, both given back if it goes no further.
    api_key_id = api_key.pk if api_key is not None else None
    ticket = Ticket.for_response(
        response_id=new_response_id(id_prefix), api_key_id=api_key_id, tenant_id=tenant.pk
    )
    sampling = prepared.sampling
    admission = await limits_admit(
        tenant=tenant,
        api_key=api_key,
        ticket=ticket,
        model=model.name,
        prompt_tokens=len(prepared.prompt_token_ids),
        completion_tokens=sampling["n"] * sampling["max_tokens"],
    )
    decision = admission.decision
    try:
        attribution = Attribution(
            api_key_id=api_key_id,
            user_id=user.pk if user is not None else None,
            source=source,
            regenerated=regenerated,
        )
        routing_key = conversation_routing_key(
            messages=request.messages, conversation_id=conversation_id, user=request.user
        )
        tap = await _dispatch(
            tenant, attribution, request, model, prepared, admission, routing_key, safety
        )
    except BaseException as exc:
        # Never reached a worker: free the slot, refund the reservations.
        await limits_release(admission)
        if isinstance(exc, APIError):
            exc.headers = {**decision.headers(), **exc.headers}
        if isinstance(exc, QueueWaitExceeded):
            metrics.request_refused(reason=metrics.QUEUE_WAIT, tier=tier.name, model=model.name)
        raise
    tap.headers.update(decision.headers())
    return tap


async def _dispatch(
    tenant: Tenant,
    attribution: Attribution,
    request: ChatCompletionRequest,
    model: ServedModel,
    prepared: PreparedPrompt,
    admission: Admission,
    routing_key: str,
    safety: PromptSafety,
) -> ResponseTap:
    tier = tenant.tier
    generation = GenerationRequest(
        response_id=admission.ticket.response_id,
        model=model.name,
        prompt_token_ids=prepared.prompt_token_ids,
        sampling=prepared.sampling,
        priority=tier.priority,
        tier=tier.name,
        tenant_id=tenant.pk,
        cache_salt=tenant.cache_salt,
        request_id=logs.context().get("request_id"),
        usage_tag=usage_tag(attribution, admission),
    )
    try:
        worker = await dispatch_request(
            generation, routing_key=routing_key, shadow_allowed=tenant.shadow_opt_in
        )
    except NoWorkerAvailable as exc:
        raise ServiceUnavailable(str(exc), code="no_worker_available") from exc
    except BusUnavailable as exc:
        raise ServiceUnavailable(code="bus_unavailable") from exc
    route = ResponseRoute(
        response_id=generation.response_id,
        tenant_id=tenant.pk,
        api_key_id=attribution.api_key_id,
        model=model.name,
        worker_id=worker.worker_id,
        n=prepared.sampling["n"],
        logprobs=prepared.sampling["logprobs"],
        include_usage=request.include_usage,
        created=int(time.time()),
        prompt_tokens=len(prepared.prompt_token_ids),
        model_version=worker.version,
        tool_parsing=prepared.tool_parsing,
    )
    await response_route_save(route=route)
    return ResponseTap.start(
        route,
        on_terminal=functools.partial(
            usage_and_limits_settle,
            admission,
            attribution=attribution,
            created_at=generation.created_at,
        ),
        leases=LeaseKeeper(admission),
        sent_at=generation.created_at,
        guard=safety.reply_guard(route, sent_at=generation.created_at),
    )


@drain.admitting
async def chat_completion_resume(*, api_key: ApiKey, response_id: str) -> ResponseTap:
    """A reader of an earlier response's events, from its first one.

    Only the tenant that created the response may read it, for as long as
    its event stream is kept (RESPONSE_STREAM_TTL). The reader settles no
    usage (the original request's tap does) and leaving it aborts nothing.
    """
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


async def response_route_save(*, route: ResponseRoute) -> None:
    """Remember who owns a response and where it runs, for stream resumes.

    The route lives as long as the response's event stream. A cache outage
    only costs resumability, never the response itself.
    """
    try:
        await cache.aset(
            route_cache_key(route.response_id),
            route.to_dict(),
            timeout=settings.RESPONSE_STREAM_TTL,
        )
    except Exception:
        logger.warning("Could not save the route of %s", route.response_id, exc_info=True)


def usage_tag(attribution: Attribution, admission: Admission) -> UsageTag:
    """What the worker's usage entry must carry for billing to settle it alone."""
    hold = admission.hold
    return UsageTag(
        api_key_id=attribution.api_key_id,
        user_id=attribution.user_id,
        source=attribution.source,
        regenerated=attribution.regenerated,
        tier_id=hold.tier_id,
        price_id=hold.price_id,
        budget_account=hold.account,
        quota_period=admission.ticket.period,
    )


async def usage_settle(
    route: ResponseRoute,
    usage: UsageSummary,
    *,
    attribution: Attribution | None = None,
    admission: Admission | None = None,
    created_at: float | None = None,
) -> None:
    """Write the response's one UsageRecord (idempotent on the response id).

    The fast path: the worker's usage entry (``wire.usage``) makes the
    settler write the same row when this process cannot. With the
    ``admission``, the record carries the tier it was admitted on and the
    price its budget hold was priced at. ``created_at`` (unix seconds) is
    when the request was enqueued, the record's date whoever writes it.
    """
    if attribution is None:
        attribution = Attribution(
            api_key_id=route.api_key_id,
            user_id=None,
            source=UsageRecord.Source.API,
            regenerated=False,
        )
    hold = admission.hold if admission is not None else None
    created = time.time() if created_at is None else created_at
    fields = dict(
        response_id=route.response_id,
        tenant_id=route.tenant_id,
        api_key_id=attribution.api_key_id,
        user_id=attribution.user_id,
        model=route.model,
        source=attribution.source,
        regenerated=attribution.regenerated,
        status=usage.status,
        finish_reason=usage.finish_reason,
        prompt_tokens=usage.prompt_tokens,
        cached_tokens=usage.cached_tokens,
        completion_tokens=usage.completion_tokens,
        queue_time_ms=usage.queue_time_ms,
        ttft_ms=usage.ttft_ms,
        duration_ms=usage.duration_ms,
        worker_id=route.worker_id,
        model_version=route.model_version,
        tier_id=hold.tier_id if hold is not None else None,
        price_id=hold.price_id if hold is not None else None,
        created_at=datetime.fromtimestamp(created, UTC),
    )
    try:
        if db_marked_down():
            raise DatabaseError("database marked down")
        await sync_to_async(usage_record_create)(**fields)
    except DatabaseError:
        # PostgreSQL is down: the usage goes to the usage stream, which the
        # settler writes once the database is back (the worker's own entry
        # may be there too: the record is unique per response).
        db_mark_down()
        if admission is not None:
            tag = usage_tag(attribution, admission)
        else:
            tag = UsageTag(attribution.api_key_id, attribution.user_id, attribution.source)
        entry = UsageEntry(
            response_id=route.response_id,
            tenant_id=route.tenant_id,
            model=route.model,
            status=usage.status,
            finish_reason=usage.finish_reason,
            prompt_tokens=usage.prompt_tokens,
            cached_tokens=usage.cached_tokens,
            completion_tokens=usage.completion_tokens,
            queue_time_ms=usage.queue_time_ms,
            ttft_ms=usage.ttft_ms,
            duration_ms=usage.duration_ms,
            created_at=created,
            finished_at=time.time(),
            worker_id=route.worker_id,
            model_version=route.model_version,
            tag=tag,
        )
        stream = get_usage_stream()
        await sync_to_async(stream.append, thread_sensitive=False)([entry])


async def usage_and_limits_settle(
    admission: Admission,
    route: ResponseRoute,
    usage: UsageSummary,
    *,
    attribution: Attribution | None = None,
    created_at: float | None = None,
) -> None:
    """The tap's terminal hook: the usage record, then the budget and rate-limit
    settlements (``limits_settle``). Every ending converges here (completed,
    failed, cancelled, client gone); each step is idempotent per response id.
    """
    try:
        await usage_settle(
            route, usage, attribution=attribution, admission=admission, created_at=created_at
        )
    finally:
        # After the record: until its hold turns into spend, the response
        # counts as held, so it never counts nowhere.
        await limits_settle(admission, usage)
