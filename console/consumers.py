"""The console chat socket (/ws/chat/): authenticate, call services, forward.

Protocol: notes ws_protocol.md (summarized in docs/architecture.md). Each
reply the socket follows has one reader task that forwards the bus events
as frames; the replies themselves belong to console.services, not to the
socket, so they end and are saved whether or not a socket is attached.
"""

from __future__ import annotations

import asyncio
import logging

from asgiref.sync import sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer

from console import revocation, services
from console.protocol import (
    ProtocolError,
    Regenerate,
    Resume,
    Send,
    Stop,
    error_frame,
    parse_command,
    refusal_frame,
    started_frame,
)
from console.selectors import membership_for_user
from inference.errors import APIError

logger = logging.getLogger(__name__)

# Close codes: 4401 unauthenticated, 4403 signed in but in no active tenant.
CLOSE_UNAUTHENTICATED = 4401
CLOSE_NO_TENANT = 4403
# A close the browser chose (page left or reloaded): abort at once.
CLEAN_CLOSE_CODES = frozenset({1000, 1001})


class ChatConsumer(AsyncJsonWebsocketConsumer):
    # No channel layer: replies are read from the bus, not from groups, and
    # an idle channel_redis receive (redis-py 8) ends in a TimeoutError that
    # would take the whole socket down.
    channel_layer_alias = None

    async def connect(self) -> None:
        self.following: dict[str, tuple[services.Reply, asyncio.Task]] = {}
        user = self.scope.get("user")
        if user is None or not user.is_authenticated:
            await self.close(code=CLOSE_UNAUTHENTICATED)
            return
        membership = await sync_to_async(membership_for_user)(user=user)
        if membership is None:
            await self.close(code=CLOSE_NO_TENANT)
            return
        self.user, self.tenant = user, membership.tenant
        await self.accept()
        # Removing the member closes this socket (console.revocation).
        await revocation.socket_register(self)

    async def revoke(self) -> None:
        """The member was removed: stop what this socket follows, close it."""
        for reply, task in list(self.following.values()):
            task.cancel()
            # Clean: abort now, nobody is to resume it.
            await services.reply_detach(reply=reply, clean=True)
        self.following = {}
        await self.close(code=CLOSE_NO_TENANT)

    async def _still_member(self) -> bool:
        """Re-checked before every command: a removal notice may be lost."""
        membership = await sync_to_async(membership_for_user)(user=self.user)
        if membership is not None and membership.tenant_id == self.tenant.pk:
            return True
        await self.revoke()
        return False

    async def receive_json(self, content, **kwargs) -> None:
        try:
            command = parse_command(content)
            if not await self._still_member():
                return
            if isinstance(command, Send):
                reply = await services.chat_send(
                    user=self.user,
                    tenant=self.tenant,
                    conversation_id=command.conversation_id,
                    content=command.content,
                    model=command.model,
                )
                await self._started(reply)
            elif isinstance(command, Regenerate):
                reply = await services.chat_regenerate(
                    user=self.user, tenant=self.tenant, conversation_id=command.conversation_id
                )
                await self._started(reply)
            elif isinstance(command, Stop):
                await services.reply_stop(
                    user=self.user, tenant=self.tenant, response_id=command.response_id
                )
            elif isinstance(command, Resume):
                reply = await services.reply_open(
                    user=self.user, tenant=self.tenant, response_id=command.response_id
                )
                await self._follow(reply, command.after_seq)
        except ProtocolError as exc:
            await self.send_json(error_frame(exc.code, exc.message))
        except APIError as exc:
            await self.send_json(refusal_frame(exc))

    async def decode_json(self, text_data):
        try:
            return await super().decode_json(text_data)
        except (ValueError, RecursionError):
            # Not JSON, or nested deeper than the parser recurses (a frame
            # of "[[[[..."): parse_command answers with an error frame.
            return None

    async def _started(self, reply: services.Reply) -> None:
        await self.send_json(
            started_frame(
                conversation_id=reply.conversation_id,
                message_id=reply.message_id,
                response_id=reply.response_id,
            )
        )
        await self._follow(reply, 0)

    async def _follow(self, reply: services.Reply, after_seq: int) -> None:
        previous = self.following.pop(reply.response_id, None)
        if previous is not None:
            previous[1].cancel()
            await services.reply_release(reply=previous[0])
        await services.reply_attach(reply=reply)
        task = asyncio.create_task(self._forward(reply, after_seq))
        self.following[reply.response_id] = (reply, task)

    async def _forward(self, reply: services.Reply, after_seq: int) -> None:
        try:
            frames = services.reply_frames(reply=reply, after_seq=after_seq, tenant=self.tenant)
            async for frame in frames:
                await self.send_json(frame)
        except asyncio.CancelledError:
            raise
        except Exception:
            # Most often the client closed the socket between two frames.
            # The reply stays listed so that disconnect() still detaches it
            # (aborting it and settling usage on a clean close).
            logger.warning("Forwarding %s stopped", reply.response_id, exc_info=True)
            return
        # Reached after the terminal frame: nothing left to abort on close.
        current = self.following.get(reply.response_id)
        if current is not None and current[1] is asyncio.current_task():
            del self.following[reply.response_id]

    async def disconnect(self, code) -> None:
        revocation.socket_unregister(self)
        clean = code in CLEAN_CLOSE_CODES
        for reply, task in list(getattr(self, "following", {}).values()):
            task.cancel()
            await services.reply_detach(reply=reply, clean=clean)
        self.following = {}
