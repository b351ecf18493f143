"""The console in a real browser, against a real worker and the demo model.

The tests of this module run in order on one page: sign in, chat with a
streamed reply, stop a reply midway, reload, API keys, usage charts.
"""

from __future__ import annotations

import asyncio
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.browser.conftest import screenshot
from tests.e2e.conftest import redis_url

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
    from inference.bus.redis_bus import RedisBus

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


def test_sign_in(page, console_site):
    page.goto("/chat/")
    assert "/accounts/login/" in page.url
    page.fill('input[name="username"]', console_site.username)
    page.fill('input[name="password"]', console_site.password)
    page.click('button[type="submit"]')
    page.wait_for_url("**/chat/")
    assert page.locator(".who .user").inner_text() == console_site.username
    page.wait_for_function("() => document.getElementById('socket-status').textContent === ''")


def test_reply_grows_in_steps_then_completes(page):
    page.evaluate(WATCH_REPLY)
    page.fill("#prompt", "Name three colors of the rainbow.")
    page.click("#send")
    reply = last_reply(page)
    page.wait_for_function(
        "() => ['completed','incomplete','failed'].includes("
        "[...document.querySelectorAll('.msg[data-role=assistant]')].pop().dataset.status)",
        timeout=180_000,
    )
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


def test_stop_midway_ends_the_request_and_frees_kv(page, console_site):
    page.fill("#prompt", "Write a very long story about a lighthouse keeper and a storm.")
    page.click("#send")
    page.wait_for_function(
        "() => { const r = [...document.querySelectorAll('.msg[data-role=assistant]')].pop();"
        " return r.dataset.status === 'streaming' && r.textContent.length > 20; }",
        timeout=120_000,
    )
    page.click("#stop")
    reply = last_reply(page)
    page.wait_for_function(
        "() => [...document.querySelectorAll('.msg[data-role=assistant]')].pop()"
        ".dataset.status === 'cancelled'",
        timeout=30_000,
    )
    stopped_text = reply.locator(".body").inner_text()
    assert "Stopped" in reply.locator(".meta").inner_text()
    # The worker freed the reply's KV blocks: heartbeats report none in use.
    deadline = time.monotonic() + 20
    while (kv := worker_kv(console_site.worker_id)) != (0, 0) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert kv == (0, 0)
    page.wait_for_timeout(500)
    assert reply.locator(".body").inner_text() == stopped_text
    assert page.locator("#send").is_enabled()


def test_reload_finds_the_conversation(page):
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


def test_create_and_revoke_an_api_key(page, console_site):
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


def test_usage_charts(page):
    page.click("nav >> text=Usage")
    page.wait_for_function("() => window.usageCharts && window.usageCharts.length === 2")
    rows = page.locator("#usage-table tbody tr")
    assert "smollm2" in rows.first.inner_text()
    datasets = page.evaluate("window.usageCharts[0].data.datasets.map(d => d.label)")
    assert datasets == ["smollm2-135m-instruct"]
    screenshot(page, "usage")
