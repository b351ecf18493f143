"""Observability of the real topology: Daphne, two gpuworkers, PostgreSQL, Redis.

Each process writes its spans to a file of its own (TRACES_FILE) and logs
JSON; each worker serves /metrics and its probes on a port of its own.
Prometheus (Debian's package) scrapes them all, and what it answers is
checked against what the test saw: its clients' stopwatch, its 429s and
the usage records.
"""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import sys
import time
import urllib.error
import urllib.request
import uuid
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path

import httpx
import pytest
from django.conf import settings
from prometheus_client.parser import text_string_to_metric_families

from billing.models import UsageRecord
from tests.e2e.prometheus import BINARY, Prometheus, finite, quantile_bounds
from tests.gpuworkers.test_metrics import VLLM_SAMPLES
from tests.plugins import topology as e2e
from wire.buckets import TTFT_BUCKETS

pytestmark = [pytest.mark.slow, pytest.mark.django_db]

ROOT = Path(__file__).resolve().parents[2]
MODEL = settings.DEMO_MODEL_NAME
DASHBOARD = ROOT / "docker" / "grafana" / "dashboards" / "llm-platform.json"
ALERTS = ROOT / "docker" / "prometheus" / "alerts.yml"


@dataclass
class Observed:
    base: str
    web: str  # host:port
    workers: dict[str, str]  # worker id -> host:port of its metrics
    keys: dict[str, str]
    tenant_ids: list[int]
    logs: Path
    procs: e2e.Processes


def _get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()
    except OSError:
        return 0, ""


@pytest.fixture(scope="module")
def observed(django_db_setup, django_db_blocker, tmp_path_factory):
    if "postgresql" not in settings.DATABASES["default"]["ENGINE"]:
        pytest.skip("the multi-process topology needs DATABASE_URL (PostgreSQL)")
    from fleet.services import served_model_register
    from tenants.models import Tenant
    from tenants.services import api_key_create, tenant_create, tier_seed_defaults

    suffix = uuid.uuid4().hex[:8]
    with django_db_blocker.unblock():
        tier_seed_defaults()
        served_model_register(name=MODEL, context_length=8192)
        tenants = {n: tenant_create(name=f"obs-{n}-{suffix}", tier_name="pro") for n in "abc"}
        tenants["c"].monthly_budget = Decimal("0")
        tenants["c"].save()
        keys = {
            "pro": api_key_create(tenant=tenants["a"], name="obs")[1],
            "limited": api_key_create(tenant=tenants["b"], name="obs", rpm_limit=2)[1],
            "broke": api_key_create(tenant=tenants["c"], name="obs")[1],
        }
    logs = tmp_path_factory.mktemp("observability")
    procs = e2e.Processes(logs)
    common = {
        "DATABASE_URL": e2e.test_db_url(),
        "REDIS_URL": e2e.redis_url(),
        "LOG_LEVEL": "INFO",
        "LOG_FORMAT": "json",
        # A snapshot key of its own: readiness follows this test's catalog only.
        "FLEET_SNAPSHOT_KEY": f"test-observe-{suffix}:snapshot",
        "FLEET_ROUTING_POLICY": "round_robin",
    }
    workers = {}
    for name in ("a", "b"):
        worker_id, port = f"obs-{name}-{suffix}", e2e.free_port()
        env = e2e.base_env(**common, TRACES_FILE=str(logs / f"spans-{name}.jsonl"))
        cmd = [sys.executable, "manage.py", "gpuworker", "--model", MODEL, "--threads", "1"]
        cmd += ["--worker-id", worker_id, "--metrics-port", str(port)]
        procs.start(f"gpuworker-{name}", [*cmd, "--metrics-host", "127.0.0.1"], env)
        workers[worker_id] = f"127.0.0.1:{port}"
    port = e2e.free_port()
    env = e2e.base_env(**common, TRACES_FILE=str(logs / "spans-web.jsonl"))
    daphne = [sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port)]
    procs.start("daphne", [*daphne, "config.asgi:application"], env)
    base = f"http://127.0.0.1:{port}"
    try:
        e2e.wait_for_http(f"{base}/v1", procs)
        deadline = time.monotonic() + 240
        while not all(_get(f"http://{w}/readyz")[0] == 200 for w in workers.values()):
            if time.monotonic() > deadline or any(p.poll() is not None for p, _ in procs.procs):
                pytest.fail(f"gpuworkers never became ready:\n{procs.output()}")
            time.sleep(0.5)
        yield Observed(
            base, f"127.0.0.1:{port}", workers, keys, [t.pk for t in tenants.values()], logs, procs
        )
    finally:
        procs.stop()
        with django_db_blocker.unblock():
            UsageRecord.objects.filter(tenant_id__in=[t.pk for t in tenants.values()]).delete()
            Tenant.objects.filter(pk__in=[t.pk for t in tenants.values()]).delete()


def test_every_process_answers_its_probes_and_the_workers_show_vllm_names(observed):
    status, body = _get(f"{observed.base}/healthz")
    assert status == 200
    status, body = _get(f"{observed.base}/readyz")
    checks = json.loads(body)["checks"]
    assert checks["workers"] == {MODEL: 2} and status == 200, body
    for address in observed.workers.values():
        assert _get(f"http://{address}/healthz")[0] == _get(f"http://{address}/readyz")[0] == 200
        families = text_string_to_metric_families(_get(f"http://{address}/metrics")[1])
        labelled = {
            s.name
            for family in families
            for s in family.samples
            if (s.labels.get("model_name"), s.labels.get("engine")) == (MODEL, "0")
        }
        assert set(VLLM_SAMPLES) <= labelled
    web_metrics = _get(f"{observed.base}/metrics")[1]
    assert "django_http_requests_total_by_method_total" in web_metrics


def _messages(i: int) -> list[dict]:
    return [{"role": "user", "content": f"Count from {i} to {i + 9}, one number per line."}]


async def _stream(client: httpx.AsyncClient, key: str, i: int, **headers) -> tuple[str, float]:
    """(response id, seconds to the first token's chunk) of one streamed completion."""
    body = {"model": MODEL, "messages": _messages(i), "stream": True, "max_tokens": 4}
    headers = {"Authorization": f"Bearer {key}", **headers}
    started = time.monotonic()
    response_id, ttft = "", None
    async with client.stream("POST", "/v1/chat/completions", json=body, headers=headers) as r:
        assert r.status_code == 200, await r.aread()
        async for line in r.aiter_lines():
            if not line.startswith("data: {"):
                continue
            chunk = json.loads(line[6:])
            response_id = chunk["id"]
            # The first chunk only carries the role; the next one is the first token.
            first_token = chunk["choices"] and "role" not in chunk["choices"][0]["delta"]
            if ttft is None and first_token:
                ttft = time.monotonic() - started
    assert ttft is not None
    return response_id, ttft


async def _traffic(observed: Observed) -> tuple[dict[str, float], dict[str, int]]:
    """Streams (up to two per worker at once), then 429s: (client TTFT by response, 429s by reason)."""
    refused = {"requests": 0, "budget": 0}
    async with httpx.AsyncClient(base_url=observed.base, timeout=120) as client:
        # One at a time first: concurrent first requests race on transformers'
        # lazy import in a fresh web process (an ImportError, a 500).
        streamed = [await _stream(client, observed.keys["pro"], i) for i in range(2)]
        streamed += await asyncio.gather(
            *(_stream(client, observed.keys["pro"], i) for i in range(2, 6))
        )
        for key, reason, tries in (("limited", "requests", 4), ("broke", "budget", 3)):
            for i in range(tries):
                body = {"model": MODEL, "messages": _messages(i), "max_tokens": 1}
                auth = {"Authorization": f"Bearer {observed.keys[key]}"}
                response = await client.post("/v1/chat/completions", json=body, headers=auth)
                if response.status_code == 429:
                    refused[reason] += 1
                else:
                    assert response.status_code == 200, response.text
    return dict(streamed), refused


async def _one_more_stream(observed: Observed) -> None:
    async with httpx.AsyncClient(base_url=observed.base, timeout=120) as client:
        await _stream(client, observed.keys["pro"], 99)


@pytest.mark.skipif(
    BINARY is None, reason="Debian's prometheus is not installed (.ci/run installs it)"
)
def test_prometheus_reports_the_ttft_and_the_429s_the_test_saw(observed, tmp_path):
    workers = {address: worker_id for worker_id, address in observed.workers.items()}
    prometheus = Prometheus(
        tmp_path,
        e2e.free_port(),
        {"web": [observed.web], "gpuworker": list(workers)},
        rule_files=[ALERTS],
    )
    try:
        # Both workers' histograms scraped at zero before any traffic: the
        # rate window starts from them.
        prometheus.wait_until("up == 1", lambda r: len(r) == 3)
        prometheus.wait_until("vllm:time_to_first_token_seconds_count", lambda r: len(r) == 2)
        time.sleep(2)
        started = time.time()
        client_ttft, refused = asyncio.run(_traffic(observed))
        assert refused == {"requests": 2, "budget": 3}
        records = _records(observed, expected=len(client_ttft) + 2)
        prometheus.wait_until(
            "sum(vllm:time_to_first_token_seconds_count)",
            lambda r: r and float(r[0]["value"][1]) == len(records),
        )
        _, at = prometheus.wait_until(
            "sum by (reason) (llmp_requests_refused_total)",
            lambda r: {s["metric"]["reason"]: int(float(s["value"][1])) for s in r} == refused,
        )
        assert at - started < 55, "the traffic outlasted the [1m] window's zero baseline"

        per_worker = finite(
            prometheus.query(
                "histogram_quantile(0.5, rate(vllm:time_to_first_token_seconds_bucket[1m]))", at
            )
        )
        assert set(per_worker) == set(workers)
        for address, p50 in per_worker.items():
            ttfts = [r.ttft_ms / 1000 for r in records if r.worker_id == workers[address]]
            low, high = quantile_bounds(0.5, list(TTFT_BUCKETS), ttfts, slack=0.001)
            assert low - 1e-9 <= p50 <= high + 1e-9, (address, p50, ttfts)
        overall = finite(
            prometheus.query(
                "histogram_quantile(0.5, sum by (le) "
                "(rate(vllm:time_to_first_token_seconds_bucket[1m])))",
                at,
            )
        )[""]
        # A mixture's median lies between its components' medians.
        assert min(per_worker.values()) - 1e-9 <= overall <= max(per_worker.values()) + 1e-9

        _dashboard_queries_run(prometheus, at)
        # The alert rules' recording rule: the web's TTFT p95 for the pro tier.
        # The web's series appear with their first observation: when the
        # traffic's pro streams all ended before that series' first scrape,
        # its rate over any window was 0 and the quantile NaN. One more
        # stream, after the series has been scraped, is an increase to see.
        asyncio.run(_one_more_stream(observed))
        prometheus.wait_until(
            'llmp:ttft_seconds:p95_5m{tier="pro"}',
            lambda r: len(r) == 1 and 0 < float(r[0]["value"][1]) < 60,
        )
        _spec_decode_counters_move(observed, prometheus)
        # What the clients timed: each first token reached them after the
        # worker produced it, and not much later (the web's first request also
        # loads the tokenizer: seconds on this shared 2-core machine).
        server = {r.response_id: r.ttft_ms / 1000 for r in records}
        for response_id, seen in client_ttft.items():
            assert server[response_id] - 0.001 <= seen < server[response_id] + 5.0
        assert statistics.median(client_ttft.values()) >= statistics.median(
            server[r] for r in client_ttft
        )

    finally:
        prometheus.stop()


def _spec_decode_counters_move(observed: Observed, prometheus: Prometheus) -> None:
    """A reply that repeats its prompt drafts: vLLM's spec-decode counters grow in a scrape."""
    names = ("drafts", "draft_tokens", "accepted_tokens")
    queries = {n: f"sum(vllm:spec_decode_num_{n}_total)" for n in names}
    before = {n: float(prometheus.query(q)[0]["value"][1]) for n, q in queries.items()}
    words = "red green blue yellow " * 6
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": f"Repeat these words, over and over: {words}"}],
        "max_tokens": 24,
        "temperature": 0,
    }
    auth = {"Authorization": f"Bearer {observed.keys['pro']}"}
    response = httpx.post(
        f"{observed.base}/v1/chat/completions", json=body, headers=auth, timeout=120
    )
    assert response.status_code == 200, response.text
    result, _ = prometheus.wait_until(
        queries["drafts"], lambda r: float(r[0]["value"][1]) > before["drafts"]
    )
    after = {n: float(prometheus.query(q)[0]["value"][1]) for n, q in queries.items()}
    assert after["draft_tokens"] - before["draft_tokens"] >= after["drafts"] - before["drafts"] > 0
    assert (
        0
        <= after["accepted_tokens"] - before["accepted_tokens"]
        <= (after["draft_tokens"] - before["draft_tokens"])
    )


def _records(observed: Observed, expected: int) -> list[UsageRecord]:
    deadline = time.monotonic() + 60
    while True:
        records = list(UsageRecord.objects.filter(tenant_id__in=observed.tenant_ids))
        if len(records) >= expected or time.monotonic() > deadline:
            assert len(records) == expected
            assert len({r.worker_id for r in records}) == 2  # round robin: both served
            return records
        time.sleep(0.3)


def _dashboard_queries_run(prometheus: Prometheus, at: float) -> None:
    """Every panel of the provisioned Grafana dashboard is valid PromQL here."""
    dashboard = json.loads(DASHBOARD.read_text())
    answered = 0
    for panel in dashboard["panels"]:
        for target in panel.get("targets", []):
            expr = target["expr"].replace("$model", ".*").replace("$__rate_interval", "1m")
            answered += bool(prometheus.query(expr, at))
    assert answered >= 6


WEB_STEPS = (
    "auth",
    "request.build",
    "model.lookup",
    "limits.count",
    "safety.screen",
    "prompt.prepare",
    "limits.admit",
    "route.save",
)


def test_one_streamed_request_is_one_trace_across_the_processes(observed):
    """Web and worker spans share the trace, parent after parent, through Redis."""
    request_id = f"req_e2e_{uuid.uuid4().hex}"

    async def one() -> str:
        async with httpx.AsyncClient(base_url=observed.base, timeout=120) as client:
            return (await _stream(client, observed.keys["pro"], 0, **{"x-request-id": request_id}))[
                0
            ]

    asyncio.run(one())
    files = {name: observed.logs / f"spans-{name}.jsonl" for name in ("web", "a", "b")}

    def spans() -> list[dict]:
        found = []
        for path in files.values():
            lines = path.read_text().splitlines() if path.exists() else []
            found += [
                s for s in map(json.loads, lines) if s["attributes"].get("request_id") == request_id
            ]
        return found

    deadline = time.monotonic() + 30
    # The short prompt is one prefill chunk: ten spans, and the web's eight
    # steps before the enqueue (bench.ttft_stages), each name once.
    while len(found := spans()) < 10 + len(WEB_STEPS) and time.monotonic() < deadline:
        time.sleep(0.3)
    by_name = {s["name"]: s for s in found}
    assert len(by_name) == len(found) == 10 + len(WEB_STEPS), sorted(s["name"] for s in found)
    assert len({s["context"]["trace_id"] for s in found}) == 1
    parent = {name: s["parent_id"] for name, s in by_name.items()}
    span_id = {name: s["context"]["span_id"] for name, s in by_name.items()}
    http = "POST /v1/chat/completions"
    assert parent[http] is None
    assert parent["dispatch"] == parent["relay"] == span_id[http]
    assert {parent[step] for step in WEB_STEPS} == {span_id[http]}
    assert parent["bus.submit"] == span_id["dispatch"]
    assert parent["gpuworker.request"] == span_id["bus.submit"]
    for phase in ("engine.queued", "engine.prefill", "engine.decode"):
        assert parent[phase] == span_id["gpuworker.request"]
    assert parent["engine.prefill_chunk"] == span_id["engine.prefill"]
    assert parent["usage.settle"] == span_id["relay"]
    service = {name: s["resource"]["attributes"]["service.name"] for name, s in by_name.items()}
    web = (http, "dispatch", "bus.submit", "relay", "usage.settle", *WEB_STEPS)
    assert {service[n] for n in web} == {"llm-platform-web"}
    assert {service[n] for n in parent if n.startswith(("gpuworker", "engine"))} == {
        "llm-platform-gpuworker"
    }

    # The web's JSON log line for the response joins the same request and trace.
    trace_id = found[0]["context"]["trace_id"].removeprefix("0x")
    lines = [
        json.loads(x)
        for x in (observed.logs / "daphne.log").read_text().splitlines()
        if x.startswith("{")
    ]
    (line,) = [x for x in lines if x.get("request_id") == request_id and "completed" in x["event"]]
    assert line["trace_id"] == trace_id and line["model"] == MODEL
    assert line["worker"] == by_name["gpuworker.request"]["attributes"]["worker_id"]
    assert line["tenant"] in observed.tenant_ids
    worker_lines = (observed.logs / "gpuworker-a.log").read_text().splitlines()
    warmed = [json.loads(x) for x in worker_lines if x.startswith("{") and "warmed up" in x]
    assert warmed and warmed[0]["worker"] in observed.workers and warmed[0]["model"] == MODEL
    assert os.path.getsize(files["web"]) > 0
