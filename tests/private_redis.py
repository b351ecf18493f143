"""A redis-server of a test's own on a free port: its command counts are the
test's alone, and it may be killed and started again without touching the
shared server."""

from __future__ import annotations

import contextlib
import subprocess
import time

import pytest
import redis

from tests.plugins.topology import free_port


class PrivateRedis:
    def __init__(self) -> None:
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [
                *("redis-server", "--port", str(self.port), "--bind", "127.0.0.1"),
                *("--save", "", "--appendonly", "no"),
            ],
            stdout=subprocess.DEVNULL,
        )
        client = redis.Redis(port=self.port)
        for _ in range(200):
            with contextlib.suppress(redis.ConnectionError):
                client.ping()
                client.close()
                return
            time.sleep(0.05)
        pytest.fail("private redis-server did not start")

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def command_calls(self, command: str) -> int:
        """How many times the server has run ``command`` (INFO commandstats)."""
        client = redis.Redis(port=self.port)
        try:
            return client.info("commandstats").get(f"cmdstat_{command}", {}).get("calls", 0)
        finally:
            client.close()
