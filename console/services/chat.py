"""Writes for the console: chat turns, replies and their lifecycle.

A reply is a response on the bus like an API one: the console builds its
``InferenceRequest`` (the conversation's turns, default sampling, a reply
length capped by CONSOLE_MAX_OUTPUT_TOKENS) and starts it through the shared
``inference.services.generation_start`` (tier model access, context caps,
tenant-wide rate limits, budget stop), attributed to the user with source
"console". Its assistant Message is written by a background task
that follows the response to its end, so a reply is saved whole even when
the browser left in the middle; sockets only read the bus stream.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from asgiref.sync import sync_to_async
from django.conf import settings
from django.contrib.auth.base_user import AbstractBaseUser
from django.core.cache import cache
from django.db import transaction
from django.utils import timezone
from redis.exceptions import RedisError

from billing.models import UsageRecord
from console import selectors
from console.models import Conversation, Message
from console.protocol import client_frame
from inference.errors import InvalidRequest, NotFound, ServiceUnavailable
from inference.moderation import policy_get, reply_guard
from inference.relay.dispatch import cancel_request, stream_events
from inference.relay.tap import ResponseTap, spawn
from inference.request import ChatPrompt, ChatTurn, InferenceRequest, new_response_id
from inference.services import generation_start
from tenants.models import Tenant
from wire.bus import BusUnavailable, get_bus
from wire.events import Delta, Terminal
from wire.sampling import Sampling
from wire.tracing import TraceContext

logger = logging.getLogger(__name__)

TITLE_CHARS = 60


@dataclass(slots=True, frozen=True)
class Reply:
    """An assistant reply's handle: the message and the response behind it."""

    conversation_id: int
    message_id: int
    response_id: str
    worker_id: str


def console_request(
    *, tenant: Tenant, model: str, turns: list[ChatTurn], regenerated: bool = False
) -> InferenceRequest:
    """A reply's internal request: the tier's caps and CONSOLE_MAX_OUTPUT_TOKENS
    decide its length; the console exposes no sampling knobs."""
    return InferenceRequest(
        model=model,
        prompt=ChatPrompt(tuple(turns)),
        sampling=Sampling(),
        tenant_id=tenant.pk,
        tier=tenant.tier.name,
        response_id=new_response_id("chatcmpl"),
        trace=TraceContext.current(),
        default_max_tokens=settings.CONSOLE_MAX_OUTPUT_TOKENS,
        source=UsageRecord.Source.CONSOLE,
        regenerated=regenerated,
    )


def _title(content: str) -> str:
    line = " ".join(content.split())
    return line if len(line) <= TITLE_CHARS else line[: TITLE_CHARS - 1] + "…"


@transaction.atomic
def _turn_save(
    *,
    user: AbstractBaseUser,
    tenant: Tenant,
    conversation: Conversation | None,
    content: str,
    model: str,
    tap: ResponseTap,
) -> Reply:
    if conversation is None:
        conversation = Conversation.objects.create(
            tenant=tenant, user=user, title=_title(content), model=model
        )
    else:
        conversation.model = model
        conversation.save(update_fields=["model", "updated_at"])
    Message.objects.create(conversation=conversation, role=Message.Role.USER, content=content)
    return _reply_create(conversation=conversation, tap=tap, regenerated=False)


def _reply_create(*, conversation: Conversation, tap: ResponseTap, regenerated: bool) -> Reply:
    message = Message.objects.create(
        conversation=conversation,
        role=Message.Role.ASSISTANT,
        status=Message.Status.IN_PROGRESS,
        response_id=tap.route.response_id,
        worker_id=tap.route.worker_id,
        model=tap.route.model,
        prompt_tokens=tap.route.prompt_tokens,
        regenerated=regenerated,
    )
    return Reply(conversation.pk, message.pk, message.response_id, message.worker_id)


async def chat_send(
    *,
    user: AbstractBaseUser,
    tenant: Tenant,
    conversation_id: int | None,
    content: str,
    model: str,
) -> Reply:
    """Add a user turn and start the reply; None starts a new conversation.

    Nothing is saved when the request is refused (rate limit, quota,
    budget, context cap, no worker): the error says why, and sending again
    leaves no trace of the refused attempt. Raises the inference APIErrors.
    """
    conversation = None
    turns: list[ChatTurn] = []
    if conversation_id is not None:
        conversation = await _conversation(user, tenant, conversation_id)
        turns = await sync_to_async(selectors.conversation_turns)(conversation=conversation)
    turns.append(ChatTurn(Message.Role.USER, content))
    request = console_request(tenant=tenant, model=model, turns=turns)
    tap = await generation_start(request=request, tenant=tenant, user=user)
    try:
        reply = await sync_to_async(_turn_save)(
            user=user,
            tenant=tenant,
            conversation=conversation,
            content=content,
            model=model,
            tap=tap,
        )
    except BaseException:
        # A reply nobody could ever see must not hold a GPU slot.
        spawn(_abort(tap.route.response_id, tap.route.worker_id))
        raise
    spawn(_reply_follow(tap, reply.message_id))
    return reply


@transaction.atomic
def _regenerated_save(*, conversation: Conversation, tap: ResponseTap) -> Reply:
    last_user = (
        conversation.messages.filter(role=Message.Role.USER, superseded=False)
        .order_by("-created_at", "-id")
        .first()
    )
    conversation.messages.filter(
        role=Message.Role.ASSISTANT, superseded=False, id__gt=last_user.pk
    ).update(superseded=True)
    conversation.save(update_fields=["updated_at"])
    return _reply_create(conversation=conversation, tap=tap, regenerated=True)


async def chat_regenerate(*, user: AbstractBaseUser, tenant: Tenant, conversation_id: int) -> Reply:
    """Answer the conversation's last user turn again, with its latest model.

    The replies it replaces stay in the database, marked superseded, and
    the usage record is flagged ``regenerated`` (a quality signal).
    """
    conversation = await _conversation(user, tenant, conversation_id)
    turns = await sync_to_async(selectors.conversation_turns)(conversation=conversation)
    while turns and turns[-1].role != Message.Role.USER:
        turns.pop()
    if not turns:
        raise InvalidRequest("This conversation has no message to answer again.")
    request = console_request(
        tenant=tenant, model=conversation.model, turns=turns, regenerated=True
    )
    tap = await generation_start(request=request, tenant=tenant, user=user)
    try:
        reply = await sync_to_async(_regenerated_save)(conversation=conversation, tap=tap)
    except BaseException:
        spawn(_abort(tap.route.response_id, tap.route.worker_id))
        raise
    spawn(_reply_follow(tap, reply.message_id))
    return reply


async def _conversation(user, tenant, conversation_id: int) -> Conversation:
    conversation = await sync_to_async(selectors.conversation_get)(
        user=user, tenant=tenant, conversation_id=conversation_id
    )
    if conversation is None:
        # Another user's or tenant's conversation looks exactly like none.
        raise NotFound(f"No conversation with id {conversation_id}.", param="conversation_id")
    return conversation


async def _reply_follow(tap: ResponseTap, message_id: int) -> None:
    """Collect the reply's text from the tap and save it at the end."""
    parts: list[str] = []
    while True:
        event = await tap.next_event()
        if isinstance(event, Delta):
            parts.extend(c.text for c in event.choices if c.index == 0)
        elif isinstance(event, Terminal):
            break
    try:
        await sync_to_async(reply_finish)(
            message_id=message_id, content="".join(parts), terminal=event
        )
    except Exception:
        logger.exception("Saving the reply of %s failed", tap.route.response_id)


def reply_finish(*, message_id: int, content: str, terminal: Terminal) -> None:
    """Store a reply's text and ending (idempotent: a finished reply is kept)."""
    usage = terminal.usage
    updates = {
        "content": content,
        "status": terminal.type.value,
        "finish_reason": terminal.finish_reason or "",
        "completion_tokens": usage.completion_tokens,
        "error": terminal.error.message if terminal.error else "",
    }
    if usage.prompt_tokens:
        updates["prompt_tokens"] = usage.prompt_tokens
    with transaction.atomic():
        written = Message.objects.filter(pk=message_id, status=Message.Status.IN_PROGRESS).update(
            **updates
        )
        if written:
            Conversation.objects.filter(messages__pk=message_id).update(updated_at=timezone.now())


@transaction.atomic
def conversation_delete(*, conversation: Conversation) -> None:
    conversation.delete()


# --- Following a reply from a socket ---


def _attach_key(response_id: str) -> str:
    return f"console:attached:{response_id}"


async def reply_open(*, user: AbstractBaseUser, tenant: Tenant, response_id: str) -> Reply:
    """The user's reply ``response_id`` if its event stream can still be read.

    Raises NotFound for another user's or tenant's reply (indistinguishable
    from an unknown one) and for a reply whose stream has expired.
    """
    message = await sync_to_async(selectors.reply_get)(
        user=user, tenant=tenant, response_id=response_id
    )
    if message is None:
        raise NotFound(f"No reply with id '{response_id}'.", param="response_id")
    try:
        alive = bool(await get_bus().read_events(response_id, 0, 0))
    except (BusUnavailable, RedisError) as exc:
        raise ServiceUnavailable(code="bus_unavailable") from exc
    if not alive:
        raise NotFound(
            f"The reply '{response_id}' has ended and can no longer be resumed; "
            "reload the conversation to see it.",
            param="response_id",
        )
    return Reply(message.conversation_id, message.pk, response_id, message.worker_id)


async def reply_attach(*, reply: Reply) -> None:
    """Count a socket as one of the reply's readers.

    The count lives in the shared cache (atomic increments on Redis), so a
    resume on any web process keeps a socket that dropped on another from
    aborting the reply, and a second tab following the same reply keeps it
    alive when the first one leaves.
    """
    key = _attach_key(reply.response_id)
    try:
        await cache.aadd(key, 0, settings.RESPONSE_STREAM_TTL)
        await cache.aincr(key)
    except Exception:
        logger.warning("Could not count a reader of %s", reply.response_id, exc_info=True)


async def reply_release(*, reply: Reply) -> int:
    """Uncount one reader; returns how many are left (0 when unknown)."""
    try:
        return await cache.adecr(_attach_key(reply.response_id))
    except Exception:
        # Expired or unreachable: nobody is known to be reading.
        return 0


async def reply_frames(
    *, reply: Reply, after_seq: int, tenant: Tenant | None = None
) -> AsyncIterator[dict[str, Any]]:
    """The browser's frames for the reply's events after ``after_seq``, terminal last.

    With the tenant's policy moderating replies, the events pass the same
    screen as the reply's own tap (from the first event, since the screen
    judges a window of the text), so the socket shows the same cut.
    """
    guard = reply_guard(policy=await policy_get(tenant)) if tenant is not None else None
    start = 0 if guard is not None else after_seq
    events = stream_events(reply.response_id, worker_id=reply.worker_id, after_seq=start)
    async for event in guard(events) if guard is not None else events:
        frame = client_frame(event, reply.response_id)
        if frame is not None and event.seq > after_seq:
            yield frame


async def reply_stop(*, user: AbstractBaseUser, tenant: Tenant, response_id: str) -> None:
    """Abort the user's reply on its worker; the stream ends ``cancelled``."""
    message = await sync_to_async(selectors.reply_get)(
        user=user, tenant=tenant, response_id=response_id
    )
    if message is None:
        raise NotFound(f"No reply with id '{response_id}'.", param="response_id")
    if message.is_final:
        return
    await _abort(response_id, message.worker_id)


async def reply_detach(*, reply: Reply, clean: bool) -> None:
    """A socket following the reply went away before its end.

    When no other socket reads the reply: a clean close (the page was left)
    aborts at once, since generating for nobody wastes the GPU; an abnormal
    drop leaves CONSOLE_RESUME_GRACE_SECONDS for the browser to reconnect
    and resume, and the reply is aborted after that unless some socket
    attached to it since.
    """
    if await reply_release(reply=reply) > 0:
        return
    if clean:
        await _abort(reply.response_id, reply.worker_id)
    else:
        spawn(_abort_unless_resumed(reply, float(settings.CONSOLE_RESUME_GRACE_SECONDS)))


async def _abort_unless_resumed(reply: Reply, grace: float) -> None:
    await asyncio.sleep(grace)
    try:
        readers = await cache.aget(_attach_key(reply.response_id)) or 0
    except Exception:
        readers = 0
    if readers <= 0:
        await _abort(reply.response_id, reply.worker_id)


async def _abort(response_id: str, worker_id: str) -> None:
    try:
        await cancel_request(response_id, worker_id=worker_id)
    except Exception:
        logger.warning("Could not abort %s", response_id, exc_info=True)
