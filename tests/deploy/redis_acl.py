"""A private redis-server with the platform's ACL users (docker/redis/).

The ACL file is rendered by docker/redis/render-acl.sh, the script the redis
container runs, so the tests exercise the shipped rules, not a copy.
"""

from __future__ import annotations

import os
import secrets
import shutil
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
import redis

ROOT = Path(__file__).resolve().parents[2]
RENDER = ROOT / "docker" / "redis" / "render-acl.sh"


@dataclass(frozen=True)
class AclRedis:
    port: int
    web_password: str
    worker_password: str

    def url(self, user: str | None = None, password: str | None = None, db: int = 0) -> str:
        if user is None:
            return f"redis://127.0.0.1:{self.port}/{db}"
        password = password or {"web": self.web_password, "worker": self.worker_password}[user]
        return f"redis://{user}:{password}@127.0.0.1:{self.port}/{db}"

    def client(self, user: str | None = None, **kwargs) -> redis.Redis:
        return redis.Redis.from_url(self.url(user), decode_responses=True, **kwargs)

    def _admin(self) -> redis.Redis:
        # A user of the test's own: neither shipped user may read the ACL LOG.
        return redis.Redis(port=self.port, username="tests", password=self.web_password + "-tests")

    def denials(self) -> list[dict]:
        """ACL LOG entries: what the platform's users were refused since the last reset."""
        return self._admin().acl_log()

    def reset_denials(self) -> None:
        self._admin().acl_log_reset()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_acl_redis(tmp: Path) -> tuple[AclRedis, subprocess.Popen]:
    if not shutil.which("redis-server"):
        pytest.skip("no redis-server binary")
    acl = AclRedis(_free_port(), secrets.token_hex(16), secrets.token_hex(16))
    acl_file = tmp / "users.acl"
    env = {
        **os.environ,
        "REDIS_WEB_PASSWORD": acl.web_password,
        "REDIS_WORKER_PASSWORD": acl.worker_password,
    }
    subprocess.run(["sh", str(RENDER), str(acl_file)], env=env, check=True)
    # The test's own user, to read the ACL LOG; not part of the shipped file.
    with acl_file.open("a") as f:
        f.write(f"user tests on >{acl.web_password}-tests ~* &* +@all\n")
    proc = subprocess.Popen(
        ["redis-server", "--port", str(acl.port), "--bind", "127.0.0.1", "--save", "",
         "--appendonly", "no", "--aclfile", str(acl_file)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            acl.client("web").ping()
            return acl, proc
        except redis.ConnectionError:
            time.sleep(0.05)
    proc.kill()
    pytest.fail("the ACL'd redis-server did not start")


@pytest.fixture(scope="module")
def acl_redis(tmp_path_factory):
    acl, proc = start_acl_redis(tmp_path_factory.mktemp("redis-acl"))
    yield acl
    proc.terminate()
    proc.wait(10)
