"""The chat socket through the real ASGI stack (session auth, routing) and
the in-process bus, with a paced worker generating the replies."""

import asyncio

import pytest
from asgiref.sync import sync_to_async

from billing.models import UsageRecord
from console.models import Conversation, Message
from inference.relay import tap as relay
from tenants.models import Tier
from tests.console.sockets import frames_until_end, open_socket
from tests.plugins.request_path import DEMO

pytestmark = [
    pytest.mark.asyncio,
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("close_db_threads"),
]


def send_frame(content="Hello there", conversation_id=None, model=DEMO) -> dict:
    return {
        "type": "chat.send",
        "conversation_id": conversation_id,
        "content": content,
        "model": model,
    }


async def settled():
    """Wait for the background readers that save replies and usage."""
    await relay.drain_background()


async def test_anonymous_socket_is_refused():
    """No session: the handshake is refused with 4401 before accept."""
    communicator = await open_socket(None, expect_accept=False)
    assert communicator.was_accepted is False
    assert communicator.close_code == 4401


async def test_user_without_tenant_is_refused(django_user_model):
    """Signed in but in no tenant: refused with 4403."""
    user = await sync_to_async(django_user_model.objects.create_user)(
        username="loner", password="x"
    )
    communicator = await open_socket(user, expect_accept=False)
    assert (communicator.was_accepted, communicator.close_code) == (False, 4403)


async def test_send_streams_deltas_and_saves_the_reply(fake_worker, user_factory):
    """A new conversation: started, every delta in order, completed; saved server-side."""
    fake_worker(tokens=5, interval=0.05)
    user = await sync_to_async(user_factory)(tier="free")
    ws = await open_socket(user)
    await ws.send_json_to(send_frame("What is KV cache?"))
    started = await ws.receive_json_from(timeout=10)
    assert started["type"] == "response.started"
    frames = await frames_until_end(ws, started["response_id"])
    await ws.disconnect()
    deltas = [f for f in frames if f["type"] == "delta"]
    assert [f["seq"] for f in deltas] == [2, 3, 4, 5, 6]
    assert "".join(f["text"] for f in deltas) == "c0t0 c0t1 c0t2 c0t3 c0t4 "
    end = frames[-1]
    assert (end["type"], end["seq"], end["finish_reason"]) == ("completed", 7, "length")
    assert end["usage"]["completion_tokens"] == 5 and end["error"] is None

    await settled()
    message = await sync_to_async(Message.objects.get)(pk=started["message_id"])
    assert (message.status, message.content, message.completion_tokens) == (
        "completed",
        "c0t0 c0t1 c0t2 c0t3 c0t4 ",
        5,
    )
    conversation = await sync_to_async(Conversation.objects.get)(pk=started["conversation_id"])
    assert conversation.title == "What is KV cache?" and conversation.user_id == user.pk
    record = await sync_to_async(UsageRecord.objects.get)(response_id=started["response_id"])
    assert (record.source, record.user_id, record.api_key_id, record.regenerated) == (
        "console",
        user.pk,
        None,
        False,
    )


async def test_second_turn_sends_the_history(fake_worker, user_factory):
    """The worker's second prompt holds the first turn and its reply."""
    worker = fake_worker(tokens=2, interval=0.05)
    user = await sync_to_async(user_factory)()
    ws = await open_socket(user)
    await ws.send_json_to(send_frame("first question"))
    first = await ws.receive_json_from(timeout=10)
    await frames_until_end(ws, first["response_id"])
    await settled()
    await ws.send_json_to(send_frame("second question", first["conversation_id"]))
    second = await ws.receive_json_from(timeout=10)
    await frames_until_end(ws, second["response_id"])
    await ws.disconnect()
    assert second["conversation_id"] == first["conversation_id"]
    assert len(worker.received[1].prompt_token_ids) > len(worker.received[0].prompt_token_ids)


async def test_cannot_attach_to_another_tenants_conversation(fake_worker, user_factory):
    """Another tenant's conversation and reply ids get errors, never events."""
    fake_worker(tokens=30, interval=0.05)
    owner = await sync_to_async(user_factory)()
    intruder = await sync_to_async(user_factory)()
    ws = await open_socket(owner)
    await ws.send_json_to(send_frame("secret plans"))
    started = await ws.receive_json_from(timeout=10)

    other = await open_socket(intruder)
    await other.send_json_to(send_frame("hi", started["conversation_id"]))
    refused = await other.receive_json_from(timeout=10)
    assert (refused["type"], refused["code"]) == ("error", "not_found")
    for command in (
        {"type": "chat.resume", "response_id": started["response_id"], "after_seq": 0},
        {"type": "chat.stop", "response_id": started["response_id"]},
        {"type": "chat.regenerate", "conversation_id": started["conversation_id"]},
    ):
        await other.send_json_to(command)
        answer = await other.receive_json_from(timeout=10)
        assert (answer["type"], answer["code"]) == ("error", "not_found"), command
    assert await other.receive_nothing(timeout=0.3)
    await other.disconnect()

    # The intruder's stop did not stop it: the owner's reply runs to the end.
    frames = await frames_until_end(ws, started["response_id"])
    assert frames[-1]["type"] == "completed"
    await ws.disconnect()
    count = await sync_to_async(
        Message.objects.filter(conversation_id=started["conversation_id"]).count
    )()
    assert count == 2


async def test_resume_after_drop_yields_every_seq_once(fake_worker, user_factory, settings):
    """Drop mid-reply (1006), resume on a new socket after the last seq: no gaps, no repeats."""
    settings.CONSOLE_RESUME_GRACE_SECONDS = 5
    worker = fake_worker(tokens=20, interval=0.03)
    user = await sync_to_async(user_factory)()
    ws = await open_socket(user)
    await ws.send_json_to(send_frame("long answer please"))
    started = await ws.receive_json_from(timeout=10)
    rid = started["response_id"]
    seen = []
    while len(seen) < 4:
        frame = await ws.receive_json_from(timeout=10)
        seen.append(frame)
    await ws.disconnect(code=1006)
    last_seq = seen[-1]["seq"]

    await asyncio.sleep(0.2)  # the reply goes on generating meanwhile
    resumed = await open_socket(user)
    await resumed.send_json_to({"type": "chat.resume", "response_id": rid, "after_seq": last_seq})
    rest = await frames_until_end(resumed, rid)
    await resumed.disconnect()

    seqs = [f["seq"] for f in seen + rest]
    assert seqs == list(range(2, 23)), seqs  # 20 deltas (2..21), completed at 22
    assert rest[-1]["type"] == "completed"
    assert rid not in worker.aborted
    await settled()
    message = await sync_to_async(Message.objects.get)(response_id=rid)
    text = "".join(f["text"] for f in seen + rest if f["type"] == "delta")
    assert message.content == text == "".join(f"c0t{i} " for i in range(20))


async def test_resume_of_ended_reply_replays_after_seq(fake_worker, user_factory):
    """A reply that ended while away: the resume sends exactly the missed frames."""
    fake_worker(tokens=4, interval=0.01)
    user = await sync_to_async(user_factory)()
    ws = await open_socket(user)
    await ws.send_json_to(send_frame("short"))
    started = await ws.receive_json_from(timeout=10)
    frames = await frames_until_end(ws, started["response_id"])
    await ws.send_json_to(
        {"type": "chat.resume", "response_id": started["response_id"], "after_seq": 3}
    )
    replay = await frames_until_end(ws, started["response_id"])
    await ws.disconnect()
    assert [f["seq"] for f in replay] == [4, 5, 6]
    assert replay == frames[-3:]


async def test_stop_aborts_on_the_worker(fake_worker, user_factory):
    """Stop midway: the worker gets the abort, the reply ends cancelled and is saved so."""
    worker = fake_worker(tokens=200, interval=0.02)
    user = await sync_to_async(user_factory)()
    ws = await open_socket(user)
    await ws.send_json_to(send_frame("go on and on"))
    started = await ws.receive_json_from(timeout=10)
    rid = started["response_id"]
    await ws.receive_json_from(timeout=10)
    await ws.send_json_to({"type": "chat.stop", "response_id": rid})
    frames = await frames_until_end(ws, rid)
    await ws.disconnect()
    assert frames[-1]["type"] == "cancelled" and frames[-1]["finish_reason"] == "abort"
    assert worker.aborted == [rid]
    await settled()
    message = await sync_to_async(Message.objects.get)(response_id=rid)
    assert message.status == "cancelled"
    assert 0 < message.completion_tokens < 200
    record = await sync_to_async(UsageRecord.objects.get)(response_id=rid)
    assert (record.status, record.completion_tokens) == ("cancelled", message.completion_tokens)


async def start_long_reply(fake_worker, user_factory):
    """A socket with a long reply under way: (worker, socket, started frame)."""
    worker = fake_worker(tokens=500, interval=0.02)
    user = await sync_to_async(user_factory)()
    ws = await open_socket(user)
    await ws.send_json_to(send_frame("long"))
    started = await ws.receive_json_from(timeout=10)
    await ws.receive_json_from(timeout=10)
    return worker, ws, started


async def aborted_ids(worker, seconds: float = 5.0) -> list[str]:
    """The worker's aborted request ids, once there are any (or after ``seconds``)."""
    for _ in range(int(seconds / 0.05)):
        if worker.aborted:
            break
        await asyncio.sleep(0.05)
    return worker.aborted


async def test_clean_close_aborts_at_once(fake_worker, user_factory, settings):
    """Leaving the page (1001) aborts the in-flight reply without a grace period."""
    settings.CONSOLE_RESUME_GRACE_SECONDS = 60
    worker, ws, started = await start_long_reply(fake_worker, user_factory)
    await ws.disconnect(code=1001)
    assert await aborted_ids(worker) == [started["response_id"]]


async def test_clean_close_aborts_even_when_a_send_failed_first(
    fake_worker, user_factory, settings, monkeypatch
):
    """The client closes between two frames: the forwarder's next send fails
    before disconnect() runs. The reply must still be aborted (a race seen
    in tests/e2e/reliability/test_console_socket.py)."""
    from console.consumers import ChatConsumer

    settings.CONSOLE_RESUME_GRACE_SECONDS = 60
    worker, ws, started = await start_long_reply(fake_worker, user_factory)
    original = ChatConsumer.send_json
    failed = asyncio.Event()

    async def closed_protocol(self, content, close=False):
        if content.get("type") == "delta":
            failed.set()
            raise ConnectionError("Attempt to send on a closed protocol")
        return await original(self, content, close)

    monkeypatch.setattr(ChatConsumer, "send_json", closed_protocol)
    await asyncio.wait_for(failed.wait(), 10)
    await asyncio.sleep(0.1)  # the forwarder has handled its failure
    await ws.disconnect(code=1000)
    assert await aborted_ids(worker) == [started["response_id"]]


async def test_a_second_tab_keeps_the_reply_alive_when_the_first_leaves(
    fake_worker, user_factory, settings
):
    """Two sockets follow one reply; the first leaving aborts nothing."""
    settings.CONSOLE_RESUME_GRACE_SECONDS = 0
    worker = fake_worker(tokens=30, interval=0.02)
    user = await sync_to_async(user_factory)()
    first = await open_socket(user)
    await first.send_json_to(send_frame("long"))
    rid = (await first.receive_json_from(timeout=10))["response_id"]
    await first.receive_json_from(timeout=10)
    second = await open_socket(user)
    await second.send_json_to({"type": "chat.resume", "response_id": rid, "after_seq": 0})
    await second.receive_json_from(timeout=10)

    await first.disconnect(code=1001)
    frames = await frames_until_end(second, rid)
    await second.disconnect()
    assert frames[-1]["type"] == "completed"
    assert worker.aborted == []


async def test_abnormal_drop_without_resume_aborts_after_grace(fake_worker, user_factory, settings):
    """A 1006 drop with nobody resuming: aborted once the grace period passes."""
    settings.CONSOLE_RESUME_GRACE_SECONDS = 1
    worker = fake_worker(tokens=500, interval=0.02)
    user = await sync_to_async(user_factory)()
    ws = await open_socket(user)
    await ws.send_json_to(send_frame("long"))
    started = await ws.receive_json_from(timeout=10)
    await ws.receive_json_from(timeout=10)
    await ws.disconnect(code=1006)
    await asyncio.sleep(0.3)
    assert worker.aborted == []
    await settled()
    assert worker.aborted == [started["response_id"]]
    message = await sync_to_async(Message.objects.get)(response_id=started["response_id"])
    assert message.status == "cancelled"


async def test_regenerate_supersedes_the_last_reply(fake_worker, user_factory):
    """Regenerate answers the last user turn again and flags its usage record."""
    worker = fake_worker(tokens=2, interval=0.01)
    user = await sync_to_async(user_factory)()
    ws = await open_socket(user)
    await ws.send_json_to(send_frame("pick a number"))
    first = await ws.receive_json_from(timeout=10)
    await frames_until_end(ws, first["response_id"])
    await settled()
    await ws.send_json_to({"type": "chat.regenerate", "conversation_id": first["conversation_id"]})
    second = await ws.receive_json_from(timeout=10)
    assert second["type"] == "response.started"
    await frames_until_end(ws, second["response_id"])
    await ws.disconnect()
    await settled()
    assert worker.received[1].prompt_token_ids == worker.received[0].prompt_token_ids
    old = await sync_to_async(Message.objects.get)(pk=first["message_id"])
    new = await sync_to_async(Message.objects.get)(pk=second["message_id"])
    assert (old.superseded, new.superseded, new.regenerated) == (True, False, True)
    record = await sync_to_async(UsageRecord.objects.get)(response_id=second["response_id"])
    assert record.regenerated is True


async def test_rate_limited_send_says_when_to_retry_and_saves_nothing(
    fake_worker, user_factory, tiers
):
    """Over the tier's requests per minute: an error with retry_after; no rows written."""
    fake_worker(tokens=1, interval=0.01)
    await sync_to_async(Tier.objects.filter(name="free").update)(rpm=1)
    user = await sync_to_async(user_factory)(tier="free")
    ws = await open_socket(user)
    await ws.send_json_to(send_frame("one"))
    first = await ws.receive_json_from(timeout=10)
    await frames_until_end(ws, first["response_id"])
    await ws.send_json_to(send_frame("two", first["conversation_id"]))
    refused = await ws.receive_json_from(timeout=10)
    await ws.disconnect()
    assert (refused["type"], refused["code"]) == ("error", "rate_limit_exceeded")
    assert 0 < refused["retry_after"] <= 60
    assert "requests per minute" in refused["message"]
    messages = await sync_to_async(list)(
        Message.objects.filter(conversation_id=first["conversation_id"]).values_list(
            "content", flat=True
        )
    )
    assert "two" not in messages and len(messages) == 2


async def test_model_outside_the_tier_is_refused(fake_worker, user_factory):
    """A model the tier may not use is refused like an unknown one."""
    fake_worker(tokens=8, interval=0.05)
    user = await sync_to_async(user_factory)()
    ws = await open_socket(user)
    await ws.send_json_to(send_frame("hi", model="gpt-imaginary"))
    refused = await ws.receive_json_from(timeout=10)
    await ws.disconnect()
    assert (refused["type"], refused["code"]) == ("error", "model_not_found")


async def test_malformed_frames_get_errors(user_factory, memory_bus):
    user = await sync_to_async(user_factory)()
    ws = await open_socket(user)
    await ws.send_to(text_data="not json")
    assert (await ws.receive_json_from())["code"] == "invalid_message"
    await ws.send_json_to(
        {"type": "chat.send", "conversation_id": None, "content": " ", "model": DEMO}
    )
    assert (await ws.receive_json_from())["code"] == "invalid_message"
    await ws.send_json_to({"type": "chat.dance"})
    assert (await ws.receive_json_from())["code"] == "unknown_type"
    await ws.disconnect()


@pytest.mark.parametrize(("tier", "max_tokens"), [("free", 512), ("enterprise", 1024)])
async def test_reply_length_is_the_console_cap_within_the_tier(
    fake_worker, user_factory, settings, tier, max_tokens
):
    """Replies reserve CONSOLE_MAX_OUTPUT_TOKENS, or the tier's smaller output cap."""
    settings.CONSOLE_MAX_OUTPUT_TOKENS = 1024
    worker = fake_worker(tokens=1, interval=0.01)
    user = await sync_to_async(user_factory)(tier=tier)
    ws = await open_socket(user)
    await ws.send_json_to(send_frame("hi"))
    started = await ws.receive_json_from(timeout=10)
    await frames_until_end(ws, started["response_id"])
    await ws.disconnect()
    assert worker.received[0].sampling.max_tokens == max_tokens
