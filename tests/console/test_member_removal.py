"""Removing a member closes their chat sockets and stops their replies.

A removed member's open socket used to keep chatting on the tenant's bill
until it closed. The removal now closes it (over Redis pub/sub, in whichever
web process holds it) with 4403, aborting the reply it follows; a socket
the notice misses is closed by the membership check before its next command.
"""

import asyncio

import pytest
from asgiref.sync import sync_to_async

from console import revocation
from console.services import member_remove
from tests.console.sockets import open_socket
from tests.console.test_consumers import aborted_ids, send_frame
from tests.plugins.request_path import DEMO

pytestmark = [
    pytest.mark.asyncio,
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("close_db_threads"),
]


async def close_code(ws, timeout: float = 10) -> int:
    """The code the server closes ``ws`` with (frames before it are skipped)."""
    while True:
        message = await ws.receive_output(timeout=timeout)
        if message["type"] == "websocket.close":
            return message.get("code")


async def remove(user) -> None:
    membership = await sync_to_async(lambda: user.membership)()
    await sync_to_async(member_remove)(tenant=membership.tenant, membership_id=membership.pk)


async def test_removing_a_member_closes_their_socket_and_aborts_the_reply(
    fake_worker, user_factory
):
    worker = fake_worker(tokens=500, interval=0.02)
    user = await sync_to_async(user_factory)()
    idle = await open_socket(user)
    ws = await open_socket(user)
    await ws.send_json_to(send_frame("long"))
    started = await ws.receive_json_from(timeout=10)
    await ws.receive_json_from(timeout=10)

    await remove(user)

    assert await close_code(ws) == 4403
    assert await close_code(idle) == 4403
    assert await aborted_ids(worker) == [started["response_id"]]


async def test_a_socket_the_notice_missed_is_closed_at_its_next_command(fake_worker, user_factory):
    """No notice (Redis pub/sub down): the next chat.send is not started."""
    worker = fake_worker(tokens=5, interval=0.01)
    user = await sync_to_async(user_factory)()
    ws = await open_socket(user)
    revocation._sockets.clear()  # as if the notice never reached this process

    await remove(user)
    await asyncio.sleep(0.2)
    await ws.send_json_to(send_frame("still here?", model=DEMO))

    assert await close_code(ws) == 4403
    assert worker.aborted == [] and not worker.received


async def test_other_members_sockets_stay_open(fake_worker, user_factory):
    fake_worker(tokens=3, interval=0.01)
    removed = await sync_to_async(user_factory)()
    tenant = await sync_to_async(lambda: removed.membership.tenant)()
    colleague = await sync_to_async(user_factory)(tenant=tenant)
    ws = await open_socket(colleague)
    gone = await open_socket(removed)

    await remove(removed)

    assert await close_code(gone) == 4403
    await ws.send_json_to(send_frame("hello"))
    assert (await ws.receive_json_from(timeout=10))["type"] == "response.started"
    await ws.disconnect()
