"""The Batches page's progress socket (/ws/batches/): live progress bars.

A tenant admin follows the tenant's batches, staff everyone's. The socket
reads the batches' progress every PUSH_SECONDS and sends what changed, as
``{"type": "batches", "batches": [...]}`` (the first frame: all of them).
No channel layer: the numbers live in the batch rows, which the feeders
(Celery) update, so a read per socket is all it takes, in any topology.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import asdict

from asgiref.sync import sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer

from batches.selectors import batch_progress
from console.consumers import CLOSE_NO_TENANT, CLOSE_UNAUTHENTICATED
from console.selectors import membership_for_user
from tenants.models import Membership

logger = logging.getLogger(__name__)

PUSH_SECONDS = 1.0


class BatchProgressConsumer(AsyncJsonWebsocketConsumer):
    # See ChatConsumer: an idle channel_redis receive would end the socket.
    channel_layer_alias = None

    async def connect(self) -> None:
        self.task: asyncio.Task | None = None
        user = self.scope.get("user")
        if user is None or not user.is_authenticated:
            await self.close(code=CLOSE_UNAUTHENTICATED)
            return
        if user.is_staff:
            self.tenant = None
        else:
            membership = await sync_to_async(membership_for_user)(user=user)
            if membership is None or membership.role != Membership.Role.ADMIN:
                await self.close(code=CLOSE_NO_TENANT)
                return
            self.tenant = membership.tenant
        await self.accept()
        self.task = asyncio.get_running_loop().create_task(self._push())

    async def disconnect(self, code) -> None:
        if self.task is not None:
            self.task.cancel()

    async def _push(self) -> None:
        sent: dict[str, dict] = {}
        first = True
        while True:
            try:
                rows = await sync_to_async(batch_progress)(tenant=self.tenant)
            except Exception:
                # The next read may work (a database blip); the page keeps
                # its last numbers meanwhile.
                logger.warning("batch progress unavailable", exc_info=True)
                rows = []
            changed = [asdict(row) for row in rows if sent.get(row.id) != asdict(row)]
            if changed or first:
                await self.send_json({"type": "batches", "batches": changed})
                sent.update({row["id"]: row for row in changed})
                first = False
            await asyncio.sleep(PUSH_SECONDS)
