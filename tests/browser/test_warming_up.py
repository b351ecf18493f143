"""The console right after start-up, while the model still loads: a message
sent then says "warming up" and is sent again by itself, instead of hanging.

Daphne in embedded mode (as `bin/run` serves) on a fresh SQLite file: the
engine thread starts loading with the server, which takes seconds, and a
person signed in at once sends before it is ready.
"""

from __future__ import annotations

import sys
import urllib.error
import urllib.request

import pytest

from tests.browser.conftest import launched_chromium
from tests.plugins.topology import Processes, base_env, free_port, wait_for_http

pytestmark = [pytest.mark.browser, pytest.mark.slow]

USER, PASSWORD = "warming-admin", "warming-pw-12"
LAST_REPLY = "[...document.querySelectorAll('.msg[data-role=assistant]')].pop()"


def test_a_message_sent_while_the_model_warms_up_is_answered(tmp_path):
    procs = Processes(tmp_path)
    env = base_env(
        SQLITE_PATH=str(tmp_path / "db.sqlite3"),
        DEMO_ADMIN_USER=USER,
        DEMO_ADMIN_PASSWORD=PASSWORD,
        DEMO_API_KEY_FILE=str(tmp_path / "demo-api-key"),
        CONSOLE_MAX_OUTPUT_TOKENS="24",
    )
    procs.run([sys.executable, "manage.py", "migrate", "--noinput"], env)
    procs.run([sys.executable, "manage.py", "seed_demo"], env)
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    daphne = [sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port)]
    procs.start("daphne", [*daphne, "config.asgi:application"], env)
    try:
        wait_for_http(f"{base}/v1", procs)
        with launched_chromium() as browser:
            context = browser.new_context(base_url=base)
            context.set_default_timeout(60_000)
            page = context.new_page()
            page.goto("/chat/")
            page.fill('input[name="username"]', USER)
            page.fill('input[name="password"]', PASSWORD)
            page.click('button[type="submit"]')
            page.wait_for_url("**/chat/")
            page.wait_for_function(
                "() => document.getElementById('socket-status').textContent === ''"
            )
            with pytest.raises(urllib.error.HTTPError) as not_ready:
                urllib.request.urlopen(f"{base}/readyz", timeout=10)
            assert not_ready.value.code == 503, "the model was ready before the test could send"

            page.fill("#prompt", "Say hello.")
            page.click("#send")
            page.wait_for_function(
                "() => window.consoleChat.frames.some(f => f.code === 'model_warming_up')"
            )
            meta = page.locator('.msg[data-role="assistant"] .meta').last.inner_text()
            assert "warming up" in meta and "sending again" in meta, meta
            # No error box: nothing for the person to do but wait.
            assert page.locator("#chat-error").is_hidden()
            page.wait_for_function(
                f"() => ['completed', 'incomplete'].includes({LAST_REPLY}.dataset.status)",
                timeout=300_000,
            )
            assert page.locator('.msg[data-role="user"]').count() == 1
            assert page.locator('.msg[data-role="assistant"]').count() == 1
            assert page.locator('.msg[data-role="assistant"] .body').inner_text().strip()
            context.close()
    finally:
        procs.stop()
