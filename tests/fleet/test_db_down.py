"""PostgreSQL stopped under a serving fleet: requests keep being served.

A private PostgreSQL (initdb + pg_ctl on a free port, never the shared
server) backs Daphne and a gpuworker as subprocesses. With it stopped, the
API key is accepted from the Redis authentication cache, the catalog and
tier come from the control snapshot, and usage goes to the usage stream,
which the settler writes to UsageRecord once PostgreSQL is back.
"""

from __future__ import annotations

import glob
import json
import os
import shutil
import subprocess
import sys
import tempfile
import urllib.error
import urllib.request
import uuid

import pytest
import redis
from django.conf import settings

from tests.plugins.topology import (
    Processes,
    base_env,
    free_port,
    redis_url,
    wait_for_http,
    wait_for_worker,
)

pytestmark = pytest.mark.slow
PG_BIN = sorted(glob.glob("/usr/lib/postgresql/*/bin"))


def _as_postgres(cmd: list[str]) -> list[str]:
    # initdb refuses to run as root.
    return ["runuser", "-u", "postgres", "--", *cmd] if os.geteuid() == 0 else cmd


class PrivatePostgres:
    def __init__(self):
        self.bin = PG_BIN[-1]
        self.dir = tempfile.mkdtemp(prefix="fleet-pg-")
        self.port = free_port()
        if os.geteuid() == 0:
            shutil.chown(self.dir, "postgres", "postgres")
        self.data = os.path.join(self.dir, "data")
        self._run("initdb", "-D", self.data, "-U", "postgres", "--auth=trust", "-E", "UTF8")
        self.url = f"postgres://postgres@127.0.0.1:{self.port}/postgres"

    def _run(self, tool: str, *args: str) -> None:
        cmd = _as_postgres([os.path.join(self.bin, tool), *args])
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stdout + done.stderr

    def start(self) -> None:
        options = f"-p {self.port} -k {self.dir} -c listen_addresses=127.0.0.1"
        log = os.path.join(self.dir, "log")
        self._run("pg_ctl", "-D", self.data, "-o", options, "-l", log, "-w", "start")

    def stop(self) -> None:
        self._run("pg_ctl", "-D", self.data, "-m", "fast", "-w", "stop")

    def remove(self) -> None:
        subprocess.run(
            _as_postgres([os.path.join(self.bin, "pg_ctl"), "-D", self.data, "-m", "immediate",
                          "stop"]),
            capture_output=True,
        )  # fmt: skip
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture
def private_postgres():
    if not PG_BIN or (os.geteuid() == 0 and not shutil.which("runuser")):
        pytest.skip("no PostgreSQL server binaries")
    server = PrivatePostgres()
    server.start()
    yield server
    server.remove()


def _chat(base_url: str, key: str, text: str) -> tuple[int, dict]:
    body = {
        "model": settings.DEMO_MODEL_NAME,
        "messages": [{"role": "user", "content": text}],
        "max_tokens": 4,
        "temperature": 0,
    }
    request = urllib.request.Request(
        f"{base_url}/chat/completions",
        data=json.dumps(body).encode(),
        headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"{}")


def test_requests_are_served_from_the_snapshot_while_postgres_is_stopped(
    private_postgres, tmp_path
):
    suffix = uuid.uuid4().hex[:8]
    usage_key = f"test-usage-{suffix}"
    env = base_env(
        DATABASE_URL=private_postgres.url,
        REDIS_URL=redis_url(),
        FLEET_SNAPSHOT_KEY=f"test-fleet-{suffix}:snapshot",
        USAGE_STREAM_KEY=usage_key,
        FLEET_SNAPSHOT_REFRESH="1",
        RATE_LIMIT_PREFIX=f"rl-{suffix}",
        DB_POOL_TIMEOUT="2",
    )
    procs = Processes(tmp_path)
    manage = [sys.executable, "manage.py"]
    client = redis.Redis.from_url(redis_url())
    try:
        # The worker needs no database for the demo model: it loads meanwhile.
        worker_id = f"fleet-db-down-{suffix}"
        procs.start("gpuworker", [*manage, "gpuworker", "--model", settings.DEMO_MODEL_NAME,
                                  "--worker-id", worker_id], env)  # fmt: skip
        procs.run([*manage, "migrate", "--noinput"], env)
        key = procs.run([*manage, "create_api_key", "--tenant", "t", "--tier", "pro"], env)
        key = key.strip().splitlines()[-1]
        procs.run([*manage, "fleet", "publish"], env)
        port = free_port()
        daphne = [sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port)]
        procs.start("daphne", [*daphne, "config.asgi:application"], env)
        base_url = f"http://127.0.0.1:{port}/v1"
        wait_for_http(base_url, procs)
        wait_for_worker(worker_id, procs)
        status, body = _chat(base_url, key, "Say hello.")
        assert status == 200, (body, procs.output())

        private_postgres.stop()
        for text in ("Name a colour.", "Name a fruit.", "Name a planet."):
            status, body = _chat(base_url, key, text)
            assert status == 200, (body, procs.output())
            assert body["choices"][0]["message"]["content"]
        # A key the database never vouched for is still refused.
        status, body = _chat(base_url, key[:-4] + "abcd", "hi")
        assert status == 401 and body["error"]["code"] == "invalid_api_key"
        # One it has never seen cannot be checked: retryable, not "invalid".
        status, body = _chat(base_url, "sk-unseen12.abcdefabcdefabcdef", "hi")
        assert status == 503 and body["error"]["code"] == "database_unavailable"
        # The worker's entry for each of the four responses, and the web
        # tier's own for each of the three it could not record.
        assert client.xlen(usage_key) == 7

        private_postgres.start()
        settled = procs.run(
            [*manage, "shell", "-c",
             "from billing.services import usage_settle_pending as s; "
             "r = s(consumer='t'); print(r.recorded, r.known, r.dead)"],
            env,
        )  # fmt: skip
        assert settled.strip().splitlines()[-1] == "3 4 0"
        count = procs.run(
            [*manage, "shell", "-c",
             "from billing.models import UsageRecord; print(UsageRecord.objects.count())"],
            env,
        )  # fmt: skip
        assert count.strip().splitlines()[-1] == "4"
        assert client.xlen(usage_key) == 0
    finally:
        procs.stop()
        client.delete(
            usage_key, f"test-fleet-{suffix}:snapshot", f"test-fleet-{suffix}:snapshot:seq"
        )
