"""Streaming load while processes die: every stream ends once, usage is exact.

    python -m bench.chaos [--requests 200] [--concurrency 16] [--max-tokens 16]

Starts its own topology on loopback: a private PostgreSQL (initdb in a temp
dir, run as the ``postgres`` user), a private redis-server (AOF, fsync on
every write, so a restart keeps the streams as a production Redis would),
two gpuworkers of the demo model (one torch thread, small KV) and two Daphne
web processes, each settling the usage stream in a thread of its own
(``USAGE_SETTLER_IN_PROCESS``; the Celery beat task runs the same service).
The client spreads ``--requests`` streaming chat completions over both web
processes, ``--concurrency`` at a time; a request refused before its stream
started (connection refused, 503) is retried on the other web process, as
a load balancer would. Meanwhile, as the completed count passes a share of
the requests: SIGKILL one web process, SIGKILL one worker (neither is
restarted: the survivors serve the rest), SIGKILL + restart Redis, fast
shutdown + restart PostgreSQL.

Invariants (exit 1 if any fails): every accepted stream (HTTP 200) ended
exactly once as its client saw it: completed (a finish_reason, one
``[DONE]``), an explicit error frame then ``[DONE]``, or, only for streams
on the SIGKILLed web process, a dropped connection; none hung (a read
timeout counts as a violation). One usage record per accepted response (0
missing, 0 duplicated) once the settlers caught up, and for completed ones
completion_tokens == the tokens the client counted. Afterwards no KV block
held on a surviving worker and no concurrency slot held in Redis.

Figures to ``--out`` (bench/results/chaos.json); recovery after a fault is
the time from the fault to the end of the first request started after it
that completed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import httpx

from bench.load import MODEL, Client, free_port, run_client

ROOT = Path(__file__).resolve().parents[1]
PG_BIN = Path("/usr/lib/postgresql/15/bin")
# Shares of the requests completed at which each fault fires, in order.
FAULTS = [
    (0.15, "kill_web"),
    (0.30, "kill_worker"),
    (0.45, "restart_redis"),
    (0.60, "restart_postgres"),
]


def progress(message: str) -> None:
    print(f"[chaos] {message}", file=sys.stderr, flush=True)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.chaos",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--kv-cache-mb", type=int, default=64)
    parser.add_argument("--stream-timeout", type=float, default=180.0, help="per read, seconds")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "chaos.json")
    return parser.parse_args(argv)


# -- the topology --------------------------------------------------------------


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
            "from bench.load import create_tenant_key; "
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


# -- the clients ---------------------------------------------------------------


@dataclass(slots=True)
class Request:
    index: int
    web: int | None = None  # the web process whose stream was accepted
    attempts: int = 0
    refusals: list[str] | None = None
    client: Client | None = None

    @property
    def accepted(self) -> bool:
        return self.client is not None and self.client.status == 200

    def outcome(self, killed_web: int | None) -> str:
        c = self.client
        if c is None or c.status != 200:
            return "refused"
        if c.failure and ("Timeout" in c.failure or c.failure == "deadline"):
            return "hung"
        if c.errors == 1 and c.finishes == 0 and c.dones == 1 and c.after_done == 0:
            return f"error:{c.failure}"
        if c.one_terminal and c.errors == 0:
            return "completed"
        if c.dones == 0 and c.finishes + c.errors <= 1 and self.web == killed_web and c.failure:
            return "connection_lost"
        return "violation"


async def run_request(
    http: httpx.AsyncClient, topology: Topology, key: str, r: Request, args, dead: set[int]
) -> None:
    r.refusals = []
    for attempt in range(8):
        r.attempts += 1
        web = (r.index + attempt) % 2
        if web in dead:
            web = 1 - web
        c = Client(r.index)
        await run_client(http, f"{topology.base_urls[web]}/chat/completions", key, c, args)
        if c.status == 200:
            r.web, r.client = web, c
            return
        r.refusals.append(c.failure or f"HTTP {c.status}")
        if c.status is None and "ConnectError" in (c.failure or ""):
            dead.add(web)
        r.client = c
        await asyncio.sleep(0.5 * (attempt + 1))


async def run_all(topology: Topology, key: str, args) -> tuple[list[Request], list[Fault]]:
    requests = [Request(i) for i in range(args.requests)]
    faults: list[Fault] = []
    dead: set[int] = set()
    gate = asyncio.Semaphore(args.concurrency)
    limits = httpx.Limits(max_connections=args.concurrency * 2, max_keepalive_connections=0)
    timeout = httpx.Timeout(60, read=args.stream_timeout)

    async def one(r: Request) -> None:
        async with gate:
            await run_request(http, topology, key, r, args, dead)

    def done_count() -> int:
        return sum(r.client is not None and r.client.ended is not None for r in requests)

    async def chaos() -> None:
        for share, name in FAULTS:
            while done_count() < share * args.requests:
                await asyncio.sleep(0.2)
            at = time.monotonic()
            progress(f"fault {name} after {done_count()} requests")
            fault = Fault(name, at, "")
            faults.append(fault)
            fault.detail = await asyncio.to_thread(inject, topology, name)
            fault.took_s = round(time.monotonic() - at, 2)

    async with httpx.AsyncClient(limits=limits, timeout=timeout) as http:
        chaos_task = asyncio.create_task(chaos())
        await asyncio.gather(*(one(r) for r in requests))
        # Every threshold is below 1: a fault still under way finishes.
        await chaos_task
    for fault in faults:
        ends = [
            r.client.ended - fault.at
            for r in requests
            if r.client is not None
            and r.client.started > fault.at
            and r.outcome(None) == "completed"
        ]
        fault.recovered_s = round(min(ends), 2) if ends else None
    return requests, faults


# -- checks afterwards ---------------------------------------------------------


def usage_rows(database_url: str, ids: list[str]) -> dict[str, list[tuple[str, int]]]:
    import psycopg

    with psycopg.connect(database_url) as conn:
        rows = conn.execute(
            "SELECT response_id, status, completion_tokens FROM billing_usagerecord"
            " WHERE response_id = ANY(%s)",
            (ids,),
        ).fetchall()
    out: dict[str, list[tuple[str, int]]] = {}
    for rid, status, tokens in rows:
        out.setdefault(rid, []).append((status, tokens))
    return out


def wait_for_usage(topology: Topology, ids: list[str], timeout: float) -> tuple[dict, float]:
    """Until every response has a record (the settlers caught up) or ``timeout``."""
    started = time.monotonic()
    while True:
        try:
            rows = usage_rows(topology.database_url, ids)
        except Exception:
            rows = {}
        if len(rows) >= len(ids) or time.monotonic() - started > timeout:
            return rows, time.monotonic() - started
        time.sleep(2)


def leftovers(topology: Topology) -> dict:
    import redis

    client = redis.Redis(port=topology.redis_port)
    now_s, now_us = client.time()
    now_ms = now_s * 1000 + now_us // 1000
    inflight = {
        k.decode(): client.zcount(k, f"({now_ms}", "+inf")
        for k in client.scan_iter(match="*:inflight")
    }
    workers = {
        w: {"kv_blocks_used": info.get("kv_blocks_used"), "running": info.get("running")}
        for w in topology.worker_ids
        if w not in topology.killed and (info := topology.worker_info(w))
    }
    return {"slots_held": inflight, "workers": workers}


def settled(left: dict) -> bool:
    return not any(left["slots_held"].values()) and all(
        (w["kv_blocks_used"] or 0) == 0 and (w["running"] or 0) == 0
        for w in left["workers"].values()
    )


def summarize(requests: list[Request], faults: list[Fault], usage: dict, left: dict) -> dict:
    killed_web = 1
    outcomes = Counter(r.outcome(killed_web) for r in requests)
    accepted = [r for r in requests if r.accepted]
    ids = [r.client.response_id for r in accepted if r.client.response_id]
    missing = [rid for rid in ids if rid not in usage]
    duplicated = [rid for rid, rows in usage.items() if len(rows) > 1]
    mismatched = [
        {
            "response_id": r.client.response_id,
            "streamed": r.client.tokens,
            "recorded": usage.get(r.client.response_id),
        }
        for r in accepted
        if r.outcome(killed_web) == "completed"
        and usage.get(r.client.response_id) != [("completed", r.client.tokens)]
    ]
    refusals = Counter(reason.split(":")[0][:60] for r in requests for reason in (r.refusals or []))
    no_id = [r.index for r in accepted if not r.client.response_id]
    violations = {
        "hung": outcomes.get("hung", 0),
        "violation": outcomes.get("violation", 0),
        "refused_after_retries": outcomes.get("refused", 0),
        "accepted_without_response_id": len(no_id),
        "usage_missing": len(missing),
        "usage_duplicated": len(duplicated),
        "usage_mismatched": len(mismatched),
        "leftovers": 0 if settled(left) else 1,
    }
    return {
        "requests": len(requests),
        "accepted": len(accepted),
        "completed": outcomes.get("completed", 0),
        "explicit_errors": {k: v for k, v in outcomes.items() if k.startswith("error:")},
        "connection_lost_on_killed_web": outcomes.get("connection_lost", 0),
        "refused_attempts_retried": dict(refusals),
        "usage_records": len(ids) - len(missing),
        "usage_missing": missing[:20],
        "usage_duplicated": duplicated[:20],
        "usage_mismatched": mismatched[:20],
        "faults": [
            {"fault": f.name, "detail": f.detail, "took_s": f.took_s, "recovered_s": f.recovered_s}
            for f in faults
        ],
        "leftovers": left,
        "violations": violations,
        "ok": not any(violations.values()),
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    topology = Topology(args)
    load_before = os.getloadavg()
    try:
        progress(f"PostgreSQL, redis-server, 2 gpuworkers, 2 Daphnes (logs in {topology.logs})")
        topology.postgres_init()
        topology.postgres_start()
        topology.redis_start()
        key = topology.prepare()
        topology.start_workers_and_webs()
        for url in topology.base_urls:
            warm = httpx.post(
                f"{url}/chat/completions",
                json={
                    "model": MODEL,
                    "messages": [{"role": "user", "content": "hi"}],
                    "max_tokens": 2,
                },
                headers={"Authorization": f"Bearer {key}"},
                timeout=300,
            )
            warm.raise_for_status()
        progress(
            f"{args.requests} streams, {args.concurrency} at a time, max_tokens {args.max_tokens}"
        )
        started = time.monotonic()
        requests, faults = asyncio.run(run_all(topology, key, args))
        wall = time.monotonic() - started
        ids = [r.client.response_id for r in requests if r.accepted and r.client.response_id]
        progress("waiting for the settlers to record every response")
        usage, settle_wait = wait_for_usage(topology, ids, timeout=240)
        progress("waiting for leases and KV to be released")
        deadline = time.monotonic() + 120
        while not settled(left := leftovers(topology)) and time.monotonic() < deadline:
            time.sleep(2)
    finally:
        progress("stopping the topology")
        topology.stop()
    from bench.peers.launch import machine_info

    summary = summarize(requests, faults, usage, left)
    summary["wall_s"] = round(wall, 1)
    summary["usage_settled_after_s"] = round(settle_wait, 1)
    result = {
        "command": "python -m bench.chaos " + " ".join(argv if argv is not None else sys.argv[1:]),
        "args": {k: str(v) for k, v in vars(args).items()},
        "summary": summary,
        "machine": machine_info(load_before),
        "requests": [
            {
                "index": r.index,
                "web": r.web,
                "attempts": r.attempts,
                "outcome": r.outcome(1),
                "response_id": r.client.response_id if r.client else None,
                "tokens": r.client.tokens if r.client else 0,
                "failure": r.client.failure if r.client else None,
            }
            for r in requests
        ],
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: v for k, v in summary.items() if k != "leftovers"}, indent=2))
    progress(f"figures in {args.out}; logs in {topology.logs}")
    if not summary["ok"]:
        progress(f"INVARIANT VIOLATED: {summary['violations']}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
