"""The console in a real browser, against a real worker and the demo model.

Sign in, chat with a streamed reply, stop a reply midway, reload, API keys,
usage charts. Each test has a browser context of its own (its own cookies)
and sets up what it needs through fixtures, so each passes alone and in any
order; only the servers and the worker are shared by the module.
"""

from __future__ import annotations

import asyncio
import json
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import pytest
from django.conf import settings

from tests.browser.conftest import screenshot
from tests.helpers import wait_until
from tests.plugins.topology import redis_url

# django_db: pytest-django sets the test database up only for a run that
# collects a test marked so; the servers under test use that database.
pytestmark = [pytest.mark.browser, pytest.mark.slow, pytest.mark.django_db]

# Records the reply's text length at every change, with its status, so the
# test can tell it grew in several steps before it completed.
WATCH_REPLY = """
() => {
  window.__growth = [];
  const transcript = document.getElementById("transcript");
  new MutationObserver(() => {
    const replies = transcript.querySelectorAll('.msg[data-role="assistant"]');
    const last = replies[replies.length - 1];
    if (!last) return;
    window.__growth.push([last.dataset.status, last.querySelector(".body").textContent.length]);
  }).observe(transcript, {subtree: true, childList: true, characterData: true, attributes: true});
}
"""
LAST_REPLY = '.msg[data-role="assistant"]:last-of-type'


def last_reply(page):
    return page.locator('#transcript .msg[data-role="assistant"]').last


def worker_kv(worker_id: str) -> tuple[int, int]:
    """(KV blocks used, running requests) from the worker's latest heartbeat."""
    from wire.bus.redis_bus import RedisBus

    async def read():
        bus = RedisBus(redis_url())
        try:
            workers = {w.worker_id: w for w in await bus.list_workers()}
            info = workers[worker_id]
            return info.kv_blocks_used, info.running
        finally:
            await bus.close()

    # Playwright's event loop runs in this thread: read from another one.
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, read()).result()


COLOURS = "Name three colors of the rainbow."
STORY = "Write a very long story about a lighthouse keeper and a storm."
LAST_STATUS = "[...document.querySelectorAll('.msg[data-role=assistant]')].pop().dataset.status"


def sign_in(page, console_site) -> None:
    """Through the login form; back on a new conversation with its socket connected."""
    page.goto("/chat/")
    page.fill('input[name="username"]', console_site.username)
    page.fill('input[name="password"]', console_site.password)
    page.click('button[type="submit"]')
    page.wait_for_url("**/chat/")
    page.wait_for_function("() => document.getElementById('socket-status').textContent === ''")


def send_and_wait(page, prompt: str) -> None:
    """Send ``prompt`` and wait until its reply has ended, however it ended."""
    page.fill("#prompt", prompt)
    page.click("#send")
    page.wait_for_function(
        f"() => ['completed','incomplete','failed'].includes({LAST_STATUS})", timeout=180_000
    )


def send_and_stop(page, prompt: str) -> None:
    """Send ``prompt``, press Stop once the reply is streaming, wait until it is cancelled."""
    page.fill("#prompt", prompt)
    page.click("#send")
    page.wait_for_function(
        "() => { const r = [...document.querySelectorAll('.msg[data-role=assistant]')].pop();"
        " return r.dataset.status === 'streaming' && r.textContent.length > 20; }",
        timeout=120_000,
    )
    page.click("#stop")
    page.wait_for_function(f"() => {LAST_STATUS} === 'cancelled'", timeout=30_000)


@pytest.fixture
def fresh_page(chromium, console_site):
    """A signed-out page in a browser context of its own: no cookies, no history."""
    context = chromium.new_context(
        base_url=console_site.base_url, viewport={"width": 1280, "height": 860}
    )
    context.set_default_timeout(30_000)
    yield context.new_page()
    context.close()


@pytest.fixture
def chat_page(fresh_page, console_site):
    """Signed in, on a new conversation, its socket connected."""
    sign_in(fresh_page, console_site)
    return fresh_page


@pytest.fixture
def chatted_conversation(chat_page):
    """A conversation made in the browser: a reply that ended, then one stopped
    midway, both saved as they ended."""
    from console.models import Message

    send_and_wait(chat_page, COLOURS)
    send_and_stop(chat_page, STORY)
    # The page shows "cancelled" at once; the server saves it when the
    # worker's cancelled ending arrives, a moment later.
    conversation_id = int(chat_page.url.rstrip("/").split("/")[-1])
    replies = Message.objects.filter(conversation_id=conversation_id, role="assistant")

    def saved() -> bool:
        statuses = list(replies.order_by("created_at", "id").values_list("status", flat=True))
        return len(statuses) == 2 and statuses[0] != "in_progress" and statuses[1] == "cancelled"

    wait_until(
        saved,
        timeout=60,
        interval=0.2,
        message="both replies saved with their endings",
    )
    return chat_page


@pytest.fixture
def api_usage(topology):
    """One real chat completion with the console tenant's API key: a usage record
    of the demo model for today."""
    body = {
        "model": settings.DEMO_MODEL_NAME,
        "messages": [{"role": "user", "content": "Say hi"}],
        "max_tokens": 2,
    }
    request = urllib.request.Request(
        f"{topology.base_url}/chat/completions",
        data=json.dumps(body).encode(),
        headers={
            "Authorization": f"Bearer {topology.keys['pro']}",
            "Content-Type": "application/json",
        },
    )
    with urllib.request.urlopen(request, timeout=180) as response:
        assert response.status == 200
        return json.load(response)


def test_sign_in(fresh_page, console_site):
    """Signed out, the chat sends to the login page; signing in comes back to the
    chat as that user, with its socket connected."""
    page = fresh_page
    page.goto("/chat/")
    assert "/accounts/login/" in page.url
    sign_in(page, console_site)
    assert page.url.endswith("/chat/")
    assert page.locator(".who .user").inner_text() == console_site.username


def test_reply_grows_in_steps_then_completes(chat_page):
    """A reply streams in token by token (several visible lengths) and completes;
    the new conversation gets its own URL."""
    page = chat_page
    page.evaluate(WATCH_REPLY)
    send_and_wait(page, COLOURS)
    reply = last_reply(page)
    assert reply.get_attribute("data-status") == "completed"
    text = reply.locator(".body").inner_text()
    assert text.strip()
    growth = page.evaluate("window.__growth")
    streaming_lengths = sorted({n for status, n in growth if status == "streaming" and n > 0})
    # More than one visible length before the end: tokens arrived as generated.
    assert len(streaming_lengths) >= 2, growth
    deltas = page.evaluate("window.consoleChat.frames.filter(f => f.type === 'delta').length")
    assert deltas >= 2
    assert "/chat/" in page.url and page.url.rstrip("/").split("/")[-1].isdigit()
    screenshot(page, "chat")


def test_stop_midway_ends_the_request_and_frees_kv(chat_page, console_site):
    """Stop mid-reply: the reply is cancelled and says so, the worker frees its KV
    blocks, no more text arrives, and a new message can be sent."""
    page = chat_page
    send_and_stop(page, STORY)
    reply = last_reply(page)
    stopped_text = reply.locator(".body").inner_text()
    assert "Stopped" in reply.locator(".meta").inner_text()
    # The worker freed the reply's KV blocks: heartbeats report none in use.
    wait_until(
        lambda: worker_kv(console_site.worker_id) == (0, 0),
        timeout=60,
        interval=0.5,
        message="no KV blocks or running requests on the worker",
    )
    # "Nothing arrives after Stop" is the behaviour here: a fixed look-again.
    page.wait_for_timeout(500)
    assert reply.locator(".body").inner_text() == stopped_text
    assert page.locator("#send").is_enabled()


def test_reload_finds_the_conversation(chatted_conversation):
    """After a reload the conversation is still the current one, with both turns
    as saved: the stopped reply still cancelled and marked Stopped."""
    page = chatted_conversation
    url = page.url
    page.reload()
    assert page.url == url
    current = page.locator('#conversation-list a[aria-current="page"]')
    assert "Name three colors" in current.inner_text()
    messages = page.locator("#transcript .msg")
    assert messages.count() == 4
    assert messages.nth(2).inner_text().startswith("Write a very long story")
    assert "Stopped" in messages.nth(3).locator(".meta").inner_text()
    assert messages.nth(3).get_attribute("data-status") == "cancelled"


def test_create_and_revoke_an_api_key(chat_page, console_site):
    """A created key's secret is shown once and works; revoked, it gets a 401 and
    the listing keeps only its prefix."""
    page = chat_page
    page.click("nav >> text=API keys")
    page.fill('input[name="name"]', "browser key")
    page.click("text=Create key")
    secret = page.locator("#new-secret").input_value()
    assert secret.startswith("sk-lp-")
    prefix = secret.split(".")[0]
    assert models_status(console_site, secret) == 200

    page.once("dialog", lambda dialog: dialog.accept())
    row = page.locator(f'tr[data-prefix="{prefix}"]')
    row.locator("text=Revoke").click()
    page.wait_for_selector(f'tr.revoked[data-prefix="{prefix}"]')
    # Shown once: the listing has the prefix, never the secret.
    assert secret not in page.content()
    assert models_status(console_site, secret) == 401


def models_status(console_site, key: str) -> int:
    request = urllib.request.Request(
        f"{console_site.base_url}/v1/models", headers={"Authorization": f"Bearer {key}"}
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status
    except urllib.error.HTTPError as exc:
        return exc.code


def test_usage_charts(chat_page, api_usage):
    """The tenant's usage of today shows in the table and in both charts, grouped
    by model: the demo model only."""
    page = chat_page
    page.click("nav >> text=Usage")
    page.wait_for_function("() => window.usageCharts && window.usageCharts.length === 2")
    rows = page.locator("#usage-table tbody tr")
    assert "smollm2" in rows.first.inner_text()
    datasets = page.evaluate("window.usageCharts[0].data.datasets.map(d => d.label)")
    assert datasets == ["smollm2-135m-instruct"]
    screenshot(page, "usage")
