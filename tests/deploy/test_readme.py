"""A newcomer's first hour, as the README tells it: `bin/run`, then the
quickstarts exactly as written, so the README cannot rot.

The test starts `bin/run` itself (embedded mode: one process, SQLite, the
demo model) on a free port with a fresh database and key file, then runs
each block that follows a `<!-- quickstart: NAME -->` marker in README.md.
Only the port in the blocks' URLs is changed; the blocks run in a
directory laid out like a checkout's (`.cache/demo-api-key`). The replies
are the model's: the test checks their shape, never their words (bfloat16
greedy decoding differs between CPUs).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.deploy.test_topology import wait_ready
from tests.plugins.topology import free_port

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
README_BASE = "http://127.0.0.1:8000"
START_TIMEOUT = 600
BLOCK = re.compile(r"<!-- quickstart: (\w+) -->\n```\w+\n(.*?)```", re.DOTALL)


def quickstarts() -> dict[str, str]:
    blocks = dict(BLOCK.findall(README.read_text()))
    assert {"readyz", "curl", "python"} <= set(blocks), sorted(blocks)
    return blocks


def test_the_readme_is_a_page_a_newcomer_reads():
    """Under 250 lines; the quickstarts are there, marked, on the default port."""
    lines = README.read_text().splitlines()
    assert len(lines) < 250, len(lines)
    assert all(README_BASE in block for block in quickstarts().values())


def start(tmp_path: Path, port: int) -> tuple[subprocess.Popen, Path]:
    """`bin/run` as a newcomer runs it, with this run's port, database and key file."""
    drop = ("DATABASE_URL", "REDIS_", "CELERY_", "TEST_", "WEB_WARM_TOKENIZERS")
    env = {k: v for k, v in os.environ.items() if not k.startswith(drop)}
    env |= {
        "PORT": str(port),
        "SQLITE_PATH": str(tmp_path / "db.sqlite3"),
        "DEMO_API_KEY_FILE": str(tmp_path / ".cache" / "demo-api-key"),
        "EMAIL_BACKEND": "django.core.mail.backends.locmem.EmailBackend",
    }
    log = tmp_path / "bin-run.log"
    proc = subprocess.Popen(
        ["bin/run"], cwd=ROOT, env=env, stdout=log.open("w"), stderr=subprocess.STDOUT,
        start_new_session=True,
    )  # fmt: skip
    return proc, log


def first_answer_while_warming(base: str, key: str, proc, log: Path) -> httpx.Response:
    """The first chat request the server answers (it must answer, not hang)."""
    deadline = time.monotonic() + START_TIMEOUT
    body = {"model": "smollm2-135m-instruct", "max_tokens": 1, "messages": [{"role": "user", "content": "hi"}]}  # fmt: skip
    while time.monotonic() < deadline:
        assert proc.poll() is None, log.read_text()[-6000:]
        try:
            return httpx.post(
                f"{base}/v1/chat/completions",
                json=body,
                headers={"Authorization": f"Bearer {key}"},
                timeout=60,
            )
        except httpx.TransportError:
            time.sleep(0.5)
    pytest.fail(f"bin/run never listened:\n{log.read_text()[-6000:]}")


def run_block(kind: str, block: str, base: str, cwd: Path) -> str:
    block = block.replace(README_BASE, base)
    if kind == "python":
        (cwd / "quickstart.py").write_text(block)
        command = [sys.executable, "quickstart.py"]
    else:
        command = ["bash", "-euo", "pipefail", "-c", block]
    done = subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"{kind} quickstart failed:\n{done.stdout}\n{done.stderr}"
    return done.stdout


@pytest.mark.slow
def test_bin_run_then_the_quickstarts_as_written(tmp_path):
    """`bin/run` says what it is doing, answers "warming up" (503 with
    Retry-After, in OpenAI's shape) instead of hanging while the model loads,
    then serves the README's curl and Python quickstarts and its console
    sign-in."""
    blocks = quickstarts()
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    proc, log = start(tmp_path, port)
    try:
        key_file = tmp_path / ".cache" / "demo-api-key"
        deadline = time.monotonic() + START_TIMEOUT
        while not key_file.exists():
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()[-6000:]
            time.sleep(0.5)
        first = first_answer_while_warming(base, key_file.read_text().strip(), proc, log)
        if first.status_code != 200:
            # The engine loads for seconds after the port opens: told, not held.
            assert first.status_code == 503, first.text
            assert first.json()["error"]["code"] == "model_warming_up"
            assert int(first.headers["Retry-After"]) > 0
        wait_ready(base, proc, log, timeout=START_TIMEOUT)
        output = log.read_text()
        for stage in ("[run] applying database migrations", "[run] serving on", "warming"):
            assert stage in output, output[-4000:]

        ready = json.loads(run_block("bash", blocks["readyz"], base, tmp_path))
        assert ready["status"] == "ready"

        reply = json.loads(run_block("bash", blocks["curl"], base, tmp_path))
        assert reply["object"] == "chat.completion"
        choice = reply["choices"][0]
        assert choice["message"]["content"].strip()
        assert choice["finish_reason"] in ("stop", "length")
        assert 0 < reply["usage"]["completion_tokens"] <= 32

        printed = run_block("python", blocks["python"], base, tmp_path)
        text, _, tally = printed.rstrip("\n").rpartition("\n")
        assert text.strip(), printed
        counts = re.fullmatch(r"\[(\d+) prompt \+ (\d+) completion tokens\]", tally)
        assert counts and int(counts[1]) > 0 and 0 < int(counts[2]) <= 48, printed

        # The console quickstart: the README's credentials sign in to the chat.
        user, password = re.search(r"sign in as `(\w+)` / `(\w+)`", README.read_text()).groups()
        with httpx.Client(base_url=base, follow_redirects=True, timeout=30) as browser:
            login = browser.get("/accounts/login/")
            token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', login.text)[1]
            chat = browser.post(
                "/accounts/login/",
                data={"username": user, "password": password, "csrfmiddlewaretoken": token},
                headers={"Referer": f"{base}/accounts/login/"},
            )
            assert chat.url.path == "/chat/" and "New chat" in chat.text
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)
