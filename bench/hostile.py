"""Issue 28's hostile requests against the real topology, with /healthz timed.

    python -m bench.hostile [--worker gpuworker|paced] [--database-url URL]

Starts, on loopback, a private redis-server, a worker of the demo model (a
``gpuworker``, or with ``--worker paced`` the synthetic ``bench.paced_worker``,
which starts in seconds) and Daphne, on a PostgreSQL database of its own
(``bench.load_topology``), plus a TCP listener that accepts connections and
never answers. Then sends each hostile request of issue 28, one after the
other, while a thread polls ``/healthz`` every 20 ms. Per request it prints
and records:

- ``healthz_worst_s``: the slowest /healthz answer while it ran (goal < 0.25 s);
- ``listener_connections``: connections the server opened to the listener
  (goal 0: a tool schema's ``$ref`` must never be fetched);
- ``status`` and ``5xx`` (goal: no 5xx);
- ``database``: /readyz's database check right after (goal ``ok``).

Writes ``--out`` (bench/results/hostile.json). Nothing here asserts.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import socket
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import httpx

from bench.load_topology import MODEL, ROOT, Topology, prepare_database

HEALTHZ_GOAL_S = 0.25


def progress(message: str) -> None:
    print(f"[hostile] {message}", file=sys.stderr, flush=True)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.hostile", description=__doc__)
    parser.add_argument("--worker", choices=["gpuworker", "paced"], default="gpuworker")
    parser.add_argument(
        "--database-url", default="postgres://postgres@127.0.0.1:5432/bench_hostile"
    )
    parser.add_argument("--timeout", type=float, default=90.0, help="per request, seconds")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "hostile.json")
    args = parser.parse_args(argv)
    # bench.load_topology reads these for its gpuworker and tier.
    args.kv_cache_mb, args.threads, args.max_concurrent = 256, 1, 64
    return args


class HostileTopology(Topology):
    """bench.load_topology's topology, optionally with the paced worker."""

    def start(self) -> None:
        if self.args.worker == "gpuworker":
            super().start()
            return
        port = self.redis_url.rsplit(":", 1)[1].split("/")[0]
        redis = ["redis-server", "--port", port, "--bind", "127.0.0.1", "--save", ""]
        self._start("redis", [*redis, "--appendonly", "no"])
        worker = [sys.executable, "-m", "bench.paced_worker", "--redis-url", self.redis_url]
        self._start("worker", [*worker, "--worker-id", self.worker_id])
        daphne = [sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(self.port)]
        self._start("daphne", [*daphne, "config.asgi:application"])
        self._wait_ready(timeout=300)


class SilentListener:
    """Accepts TCP connections and never answers; counts them."""

    def __init__(self):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.port = self.sock.getsockname()[1]
        self.accepted: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            # Held open, unanswered, until the end: a fetch waits its timeout.
            self.accepted.append(conn)

    @property
    def count(self) -> int:
        return len(self.accepted)

    def close(self) -> None:
        self.sock.close()
        for conn in self.accepted:
            conn.close()


class HealthzPoller:
    """Polls /healthz every ``every`` seconds in a thread; the worst latency."""

    def __init__(self, root_url: str, every: float = 0.02):
        self.url, self.every = f"{root_url}/healthz", every
        self.worst = 0.0
        self.polls = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> HealthzPoller:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        self._thread.join(60)

    def _run(self) -> None:
        with httpx.Client(timeout=120) as client:
            # At least one poll, however short the request.
            while True:
                started = time.monotonic()
                # A failed poll counts with the time it took to fail.
                with contextlib.suppress(httpx.HTTPError):
                    client.get(self.url)
                self.worst = max(self.worst, time.monotonic() - started)
                self.polls += 1
                if self._stop.wait(self.every):
                    return


@dataclass(slots=True)
class Outcome:
    name: str
    what: str
    statuses: list[int] = field(default_factory=list)
    server_errors: int = 0
    healthz_worst_s: float = 0.0
    healthz_polls: int = 0
    listener_connections: int = 0
    database_after: str = ""
    seconds: float = 0.0
    # What the first answer said (truncated), to see how it was refused.
    first_answer: str = ""


# A hostile request: a name, what it is, and a call that sends it (one or
# more HTTP requests) and returns the responses' status codes and bodies.
Probe = tuple[str, str, Callable[[httpx.Client, dict], list[httpx.Response]]]


def chat(client: httpx.Client, ctx: dict, body: dict, key: str | None = None) -> httpx.Response:
    headers = {"Authorization": f"Bearer {key or ctx['key']}"}
    return client.post(f"{ctx['base']}/chat/completions", json=body, headers=headers)


def raw_post(client: httpx.Client, ctx: dict, path: str, content: bytes) -> httpx.Response:
    headers = {"Authorization": f"Bearer {ctx['key']}", "Content-Type": "application/json"}
    return client.post(f"{ctx['base']}{path}", content=content, headers=headers)


def probes() -> list[Probe]:
    hi = [{"role": "user", "content": "hi"}]

    def tool(parameters: dict) -> list[dict]:
        return [{"type": "function", "function": {"name": "f", "parameters": parameters}}]

    return [
        (
            "chat_percent_100k",
            "one chat message of 100,000 '%' (PII e-mail pattern bait; item 1)",
            lambda c, x: [
                chat(c, x, {"model": MODEL, "max_tokens": 4,
                            "messages": [{"role": "user", "content": "%" * 100_000}]})
            ],
        ),
        (
            "moderations_oversize",
            "/v1/moderations with an input of 100,000 '%' (items 1, 7)",
            lambda c, x: [
                c.post(f"{x['base']}/moderations", json={"input": ["%" * 100_000]},
                       headers={"Authorization": f"Bearer {x['key']}"})
            ],
        ),
        (
            "tool_ref_http",
            "a tool schema whose $ref is a listener that never answers (item 2)",
            lambda c, x: [
                chat(c, x, {"model": MODEL, "max_tokens": 4, "messages": hi,
                            "tools": tool({"$ref": f"http://127.0.0.1:{x['listener']}/s.json"})})
            ],
        ),
        (
            "tool_ref_file",
            "a tool schema whose $ref is file:///etc/passwd (item 2)",
            lambda c, x: [
                chat(c, x, {"model": MODEL, "max_tokens": 4, "messages": hi,
                            "tools": tool({"$ref": "file:///etc/passwd"})})
            ],
        ),
        (
            "nul_in_model",
            "a NUL byte in model (item 3)",
            lambda c, x: [chat(c, x, {"model": MODEL + "\x00", "max_tokens": 4, "messages": hi})],
        ),
        (
            "nul_in_content",
            "a NUL byte in a message (item 3)",
            lambda c, x: [
                chat(c, x, {"model": MODEL, "max_tokens": 4,
                            "messages": [{"role": "user", "content": "a\x00b"}]})
            ],
        ),
        (
            "resume_burst",
            "12 resumes of an unknown stream with a key of 5 requests/minute (item 7)",
            lambda c, x: [
                c.get(f"{x['base']}/chat/completions/chatcmpl-{i:032x}/events",
                      headers={"Authorization": f"Bearer {x['limited_key']}"})
                for i in range(12)
            ],
        ),
        (
            "moderations_burst",
            "12 moderations with a key of 5 requests/minute (item 7)",
            lambda c, x: [
                c.post(f"{x['base']}/moderations", json={"input": "hello"},
                       headers={"Authorization": f"Bearer {x['limited_key2']}"})
                for _ in range(12)
            ],
        ),
        (
            "too_long_burst",
            "12 chats refused for their length with a key of 5 requests/minute (item 7)",
            lambda c, x: [
                chat(c, x, {"model": MODEL, "max_tokens": 4,
                            "messages": [{"role": "user", "content": "word " * 10_000}]},
                     key=x["limited_key3"])
                for _ in range(12)
            ],
        ),
        (
            "tool_text_deny",
            "a tool description carrying a deny-listed term and an e-mail address (item 8)",
            lambda c, x: [
                chat(c, x, {"model": MODEL, "max_tokens": 4, "messages": hi,
                            "tools": [{"type": "function", "function": {
                                "name": "f",
                                "description": "mail jane.doe@example.com the acme secret",
                                "parameters": {"type": "object", "properties": {}}}}]})
            ],
        ),
        (
            "openai_client_fields",
            "fields real OpenAI clients send: service_tier, metadata, store, ... (item 14)",
            lambda c, x: [
                chat(c, x, {"model": MODEL, "max_tokens": 4, "messages": hi,
                            "service_tier": "auto", "metadata": {"a": "b"}, "store": False,
                            "prompt_cache_key": "k", "safety_identifier": "s", "user": "u",
                            "functions": [{"name": "f", "parameters": {"type": "object"}}],
                            "function_call": "auto"})
            ],
        ),
        (
            "deep_nesting",
            "a body nested 100,000 deep (item 15)",
            lambda c, x: [raw_post(c, x, "/chat/completions", b"[" * 100_000 + b"]" * 100_000)],
        ),
    ]  # fmt: skip


def create_keys() -> dict[str, str]:
    """Runs inside ``manage.py shell``: a roomy key, and three keys of 5 requests a minute."""
    from bench.load_topology import create_tenant_key
    from tenants.selectors import api_key_authenticate
    from tenants.services import api_key_create

    key = create_tenant_key(max_concurrent=64)
    tenant = api_key_authenticate(raw_key=key).tenant
    limited = {}
    for suffix in ("", "2", "3"):
        name = f"limited{suffix}"
        limited[f"limited_key{suffix}"] = api_key_create(tenant=tenant, name=name, rpm_limit=5)[1]
    return {"key": key, **limited}


def prepare(topology: Topology) -> dict[str, str]:
    import subprocess

    prepare_database(topology)
    code = "from bench.hostile import create_keys; import json; print(json.dumps(create_keys()))"
    done = subprocess.run(
        [sys.executable, "manage.py", "shell", "-c", code],
        cwd=ROOT,
        env=topology.env(),
        check=True,
        capture_output=True,
        text=True,
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


def readyz_database(client: httpx.Client, root: str) -> str:
    try:
        return client.get(f"{root}/readyz").json()["checks"]["database"]
    except (httpx.HTTPError, ValueError, KeyError) as exc:
        return f"unreadable ({exc})"


def run_probe(probe: Probe, ctx: dict, listener: SilentListener, timeout: float) -> Outcome:
    name, what, send = probe
    outcome = Outcome(name, what)
    before = listener.count
    started = time.monotonic()
    with HealthzPoller(ctx["root"]) as poller, httpx.Client(timeout=timeout) as client:
        try:
            responses = send(client, ctx)
        except httpx.HTTPError as exc:
            responses = []
            outcome.first_answer = f"client error: {exc!r}"
    outcome.seconds = round(time.monotonic() - started, 3)
    outcome.healthz_worst_s = round(poller.worst, 3)
    outcome.healthz_polls = poller.polls
    outcome.listener_connections = listener.count - before
    outcome.statuses = [r.status_code for r in responses]
    outcome.server_errors = sum(1 for s in outcome.statuses if s >= 500)
    if responses and not outcome.first_answer:
        outcome.first_answer = responses[0].text[:300]
    with httpx.Client(timeout=30) as client:
        outcome.database_after = readyz_database(client, ctx["root"])
    return outcome


def main(argv: list[str] | None = None) -> int:
    from bench.peers.launch import machine_info

    args = parse_args(argv)
    load_before = os.getloadavg()
    topology = HostileTopology(args)
    listener = SilentListener()
    progress("preparing the database")
    keys = prepare(topology)
    progress(f"starting redis, the {args.worker} and daphne")
    topology.start()
    root = topology.base_url.removesuffix("/v1")
    ctx = {"base": topology.base_url, "root": root, "listener": listener.port, **keys}
    outcomes: list[Outcome] = []
    try:
        # Warm-up: the tokenizer and the classifier load on first use.
        with httpx.Client(timeout=120) as client:
            chat(client, ctx, {"model": MODEL, "max_tokens": 2,
                               "messages": [{"role": "user", "content": "hi"}]})  # fmt: skip
        for probe in probes():
            progress(f"{probe[0]}: {probe[1]}")
            outcome = run_probe(probe, ctx, listener, args.timeout)
            outcomes.append(outcome)
            print(_row(outcome), flush=True)
    finally:
        topology.stop()
        listener.close()
    result = {
        "config": {"worker": args.worker, "healthz_poll_s": 0.02, "goal_healthz_s": HEALTHZ_GOAL_S},
        "requests": [asdict(o) for o in outcomes],
        "summary": {
            "healthz_worst_s": max((o.healthz_worst_s for o in outcomes), default=None),
            "listener_connections": sum(o.listener_connections for o in outcomes),
            "server_errors": sum(o.server_errors for o in outcomes),
            "database_always_up": all(o.database_after == "ok" for o in outcomes),
        },
        "machine": machine_info(load_before),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result["summary"], indent=2))
    return 0


def _row(o: Outcome) -> str:
    statuses = ",".join(str(s) for s in sorted(set(o.statuses)))
    flag = "" if o.healthz_worst_s < HEALTHZ_GOAL_S else "  <- over goal"
    return (
        f"{o.name:22} healthz worst {o.healthz_worst_s:7.3f} s{flag:15} "
        f"listener {o.listener_connections}  5xx {o.server_errors}  "
        f"status {statuses:12} db after {o.database_after}"
    )


if __name__ == "__main__":
    sys.exit(main())
