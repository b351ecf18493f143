"""Closing a removed member's chat sockets, in whichever web process holds them.

Each process keeps its open chat consumers by user id. Removing a member
publishes the user's id on a Redis channel (every web process subscribes
while it holds a socket); each process closes that user's sockets there,
stopping the replies they follow. Without Redis (embedded mode) there is
one process, and the close is handed straight to its event loop. A
notice that never arrives (Redis down) still cannot keep the socket
useful: the consumer re-checks the membership before every command.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import TYPE_CHECKING

import redis
import redis.asyncio as aioredis
from django.conf import settings
from django.db import transaction

if TYPE_CHECKING:
    from console.consumers import ChatConsumer

logger = logging.getLogger(__name__)

CHANNEL = "console:member-removed"
# How long a new socket waits for the subscription before it is served
# anyway (the per-command membership check still holds).
SUBSCRIBE_TIMEOUT = 2.0

_sockets: dict[int, set[ChatConsumer]] = {}
_loop: asyncio.AbstractEventLoop | None = None
_listener: asyncio.Task | None = None
_subscribed = asyncio.Event()


async def socket_register(consumer: ChatConsumer) -> None:
    """Track an accepted socket; subscribe this process on its first one."""
    global _loop, _listener, _subscribed
    _sockets.setdefault(consumer.user.pk, set()).add(consumer)
    loop = asyncio.get_running_loop()
    if _loop is not loop or _listener is None or _listener.done():
        # A new event loop (tests start one each) needs its own listener.
        _loop, _subscribed = loop, asyncio.Event()
        _listener = loop.create_task(_listen(_subscribed)) if settings.REDIS_URL else None
        if _listener is None:
            _subscribed.set()
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(_subscribed.wait(), SUBSCRIBE_TIMEOUT)


def socket_unregister(consumer: ChatConsumer) -> None:
    user = getattr(consumer, "user", None)
    sockets = _sockets.get(user.pk) if user is not None else None
    if sockets is not None:
        sockets.discard(consumer)
        if not sockets:
            del _sockets[user.pk]


def member_sockets_close(*, user_id: int) -> None:
    """Close the user's chat sockets in every web process (from sync code)."""
    if settings.REDIS_URL:
        try:
            client = redis.Redis.from_url(settings.REDIS_URL, socket_timeout=2)
            with contextlib.closing(client):
                client.publish(CHANNEL, str(user_id))
            return
        except redis.RedisError:
            logger.warning("could not publish the removal of user %s; closing locally", user_id)
    loop = _loop
    if loop is not None and not loop.is_closed():
        loop.call_soon_threadsafe(lambda: loop.create_task(_close_local(user_id)))


def membership_deleted(sender, instance, **kwargs) -> None:
    """post_delete of a Membership: close the user's sockets after the commit."""
    user_id = instance.user_id
    transaction.on_commit(lambda: member_sockets_close(user_id=user_id))


async def _close_local(user_id: int) -> None:
    for consumer in list(_sockets.pop(user_id, ())):
        try:
            await consumer.revoke()
        except Exception:
            logger.exception("closing a removed member's socket failed")


async def _listen(subscribed: asyncio.Event) -> None:
    """Close the sockets of each user id published on CHANNEL (for the
    process's life: one idle connection)."""
    while True:
        client = aioredis.Redis.from_url(settings.REDIS_URL)
        try:
            async with client.pubsub() as pubsub:
                await pubsub.subscribe(CHANNEL)
                subscribed.set()
                while True:
                    message = await pubsub.get_message(ignore_subscribe_messages=True, timeout=1.0)
                    if message is not None:
                        with contextlib.suppress(ValueError):
                            await _close_local(int(message["data"]))
        except (redis.RedisError, OSError):
            logger.warning("member-removal channel unavailable; retrying in 1 s")
            await asyncio.sleep(1.0)
        finally:
            await client.aclose()
