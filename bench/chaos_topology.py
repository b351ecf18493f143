"""The chaos benchmark's topology and faults (``python -m bench.chaos``).

``Topology`` starts and stops, on loopback, a private PostgreSQL (initdb in
a temp dir, run as the ``postgres`` user), a private redis-server (AOF,
fsync on every write), two gpuworkers of the demo model and two Daphne web
processes; ``inject`` does one fault to it (SIGKILL a web process or a
worker, SIGKILL + restart Redis, fast shutdown + restart PostgreSQL).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

from bench.load_topology import MODEL, free_port

ROOT = Path(__file__).resolve().parents[1]
PG_BIN = Path("/usr/lib/postgresql/15/bin")


class Topology:
    """PostgreSQL, redis-server, two gpuworkers, two Daphnes; ``stop`` leaves none."""

    def __init__(self, args: argparse.Namespace):
        self.args = args
        self.dir = Path(tempfile.mkdtemp(prefix="bench-chaos-"))
        self.logs = self.dir / "logs"
        self.logs.mkdir()
        self.pg_port, self.redis_port = free_port(), free_port()
        self.database_url = f"postgres://postgres@127.0.0.1:{self.pg_port}/chaos"
        self.redis_url = f"redis://127.0.0.1:{self.redis_port}/0"
        self.web_ports = [free_port(), free_port()]
        self.base_urls = [f"http://127.0.0.1:{p}/v1" for p in self.web_ports]
        self.worker_ids = [f"chaos-{os.getpid()}-w{i}" for i in range(2)]
        self.procs: dict[str, subprocess.Popen] = {}
        # Processes a fault took down (their exit is no start-up failure).
        self.killed: set[str] = set()
        self.secret = os.urandom(24).hex()

    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL")}
        env.update(
            DJANGO_SETTINGS_MODULE="config.settings",
            # Loopback only: local mode's hosts, no TLS-only cookies.
            DJANGO_ENV="local",
            DJANGO_SECRET_KEY=self.secret,
            DATABASE_URL=self.database_url,
            REDIS_URL=self.redis_url,
            ENGINE_KV_CACHE_MB=str(self.args.kv_cache_mb),
            ENGINE_THREADS="1",
            # OpenMP spin-waiting on an oversubscribed machine slows the
            # engine several times over.
            OMP_WAIT_POLICY="PASSIVE",
            USAGE_SETTLER_IN_PROCESS="1",
            USAGE_SETTLE_INTERVAL="2",
            LOG_LEVEL="WARNING",
            DJANGO_DEBUG="0",
        )
        return env

    def _start(self, name: str, cmd: list[str], **kwargs) -> subprocess.Popen:
        log = (self.logs / f"{name}.log").open("a")
        kwargs.setdefault("cwd", ROOT)
        kwargs.setdefault("env", self.env())
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, **kwargs)
        self.procs[name] = proc
        return proc

    # PostgreSQL refuses to run as root: its data dir belongs to postgres.
    def _as_postgres(self, cmd: list[str]) -> list[str]:
        return ["runuser", "-u", "postgres", "--", *cmd] if os.geteuid() == 0 else cmd

    def postgres_init(self) -> None:
        data = self.dir / "pg"
        data.mkdir()
        if os.geteuid() == 0:
            shutil.chown(self.dir, "postgres")
            shutil.chown(data, "postgres")
        subprocess.run(
            self._as_postgres(
                [str(PG_BIN / "initdb"), "-D", str(data), "-A", "trust", "-U", "postgres"]
            ),
            cwd=data,
            check=True,
            capture_output=True,
        )

    def postgres_start(self) -> None:
        data = self.dir / "pg"
        cmd = [
            *(str(PG_BIN / "postgres"), "-D", str(data), "-p", str(self.pg_port)),
            *("-k", str(data), "-c", "listen_addresses=127.0.0.1", "-c", "fsync=off"),
            *("-c", "max_connections=200"),
        ]
        self._start("postgres", self._as_postgres(cmd), cwd=data)
        self._wait(lambda: self._pg_ready(), 60, "PostgreSQL")

    def _pg_ready(self) -> bool:
        done = subprocess.run(
            [str(PG_BIN / "pg_isready"), "-h", "127.0.0.1", "-p", str(self.pg_port)],
            capture_output=True,
        )
        return done.returncode == 0

    def postgres_stop(self) -> None:
        # Fast shutdown: clients disconnected, a checkpoint, then exit. Through
        # pg_ctl: runuser does not pass SIGINT on to the postmaster.
        pg_ctl = [str(PG_BIN / "pg_ctl"), "-D", str(self.dir / "pg"), "stop", "-m", "fast", "-w"]
        subprocess.run(
            self._as_postgres(pg_ctl), cwd=self.dir / "pg", check=True, capture_output=True
        )
        self.procs["postgres"].wait(60)

    def redis_start(self) -> None:
        cmd = [
            *("redis-server", "--port", str(self.redis_port), "--bind", "127.0.0.1"),
            *("--dir", str(self.dir), "--save", "", "--appendonly", "yes"),
            *("--appendfsync", "always"),
        ]
        self._start("redis", cmd)
        self._wait(self._redis_ready, 30, "redis-server")

    def _redis_ready(self) -> bool:
        import redis

        try:
            client = redis.Redis(port=self.redis_port, socket_connect_timeout=1)
            return bool(client.ping())
        except redis.RedisError:
            return False

    def redis_kill(self) -> None:
        proc = self.procs["redis"]
        proc.kill()
        proc.wait(10)

    def _manage(self, *args: str) -> str:
        done = subprocess.run(
            [sys.executable, "manage.py", *args],
            cwd=ROOT,
            env=self.env(),
            capture_output=True,
            text=True,
        )
        if done.returncode != 0:
            raise RuntimeError(f"manage.py {args[0]} failed:\n{done.stdout}\n{done.stderr[-3000:]}")
        return done.stdout

    def prepare(self) -> str:
        """Create and migrate the database; a tenant on a roomy tier, its key."""
        subprocess.run(
            [
                str(PG_BIN / "createdb"),
                "-h",
                "127.0.0.1",
                "-p",
                str(self.pg_port),
                "-U",
                "postgres",
                "chaos",
            ],
            check=True,
            capture_output=True,
        )
        self._manage("migrate", "--noinput")
        code = (
            "from bench.load_topology import create_tenant_key; "
            "from fleet.services import snapshot_publish; "
            "key = create_tenant_key(max_concurrent=256); snapshot_publish(); print(key)"
        )
        return self._manage("shell", "-c", code).strip().splitlines()[-1]

    def start_workers_and_webs(self) -> None:
        manage = [sys.executable, "manage.py", "gpuworker", "--model", MODEL]
        for worker_id in self.worker_ids:
            # One after the other: two warm-ups at once thrash 2 cores.
            self._start(worker_id, [*manage, "--worker-id", worker_id])
            self._wait(
                lambda w=worker_id: self.worker_info(w).get("state") == "ready", 900, worker_id
            )
        for i, port in enumerate(self.web_ports):
            daphne = [sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port)]
            self._start(f"web{i}", [*daphne, "config.asgi:application"])
        for url in self.base_urls:
            self._wait(lambda u=url: self._http_up(u), 300, url)

    def _http_up(self, base_url: str) -> bool:
        try:
            return httpx.get(f"{base_url}/models", timeout=2).status_code in (200, 401)
        except httpx.HTTPError:
            return False

    def worker_info(self, worker_id: str) -> dict:
        import redis

        try:
            client = redis.Redis(port=self.redis_port, socket_connect_timeout=1)
            raw = client.hget("llm:workers", worker_id)
        except redis.RedisError:
            return {}
        return json.loads(raw) if raw else {}

    def _wait(self, condition, timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while not condition():
            for name, proc in self.procs.items():
                if proc.poll() is not None and name not in self.killed:
                    raise RuntimeError(f"{name} exited while waiting for {what}:\n{self.output()}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"{what} not up within {timeout}s:\n{self.output()}")
            time.sleep(0.5)

    def output(self) -> str:
        return "\n".join(
            f"--- {p.name}\n{p.read_text()[-2000:]}" for p in sorted(self.logs.glob("*.log"))
        )

    def stop(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.terminate()
        for proc in self.procs.values():
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)


# -- faults --------------------------------------------------------------------


@dataclass(slots=True)
class Fault:
    name: str
    at: float  # monotonic
    detail: str
    took_s: float | None = None
    recovered_s: float | None = None
    # kill_worker: seconds from the kill to the worker_lost error of each
    # stream that had started on it (the web's death detection; goal < 2 s).
    detected_s: list[float] | None = None


def inject(topology: Topology, name: str) -> str:
    """Do one fault (blocking); returns what was done."""
    if name == "kill_web":
        topology.procs["web1"].kill()
        topology.killed.add("web1")
        return "SIGKILL web1 (not restarted)"
    if name == "kill_worker":
        victim = topology.worker_ids[0]
        topology.procs[victim].kill()
        topology.killed.add(victim)
        return f"SIGKILL {victim} (not restarted)"
    if name == "restart_redis":
        topology.killed.add("redis")
        topology.redis_kill()
        topology.redis_start()
        return "SIGKILL redis-server, restarted on the same port and AOF"
    if name == "restart_postgres":
        topology.killed.add("postgres")
        topology.postgres_stop()
        topology.postgres_start()
        return "PostgreSQL fast shutdown, restarted"
    raise ValueError(name)
