"""The worker's metrics port: /healthz and /readyz through a worker's life."""

from __future__ import annotations

import json
import socket
import urllib.error
import urllib.request

import pytest
from django.core.management import CommandError

from gpuworkers.management.commands.gpuworker import Command
from gpuworkers.probes import ProbeServer, loop_status
from tests.helpers import wait_until
from tests.wire.bus.buses import make_buses


def _get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


def test_the_probes_follow_the_loop_from_ready_to_stopped(serve):
    """/readyz is 200 only while serving; /healthz until the loop has stopped."""
    _, worker_bus = make_buses("memory")
    loop = serve(worker_bus)
    probes = ProbeServer(lambda: loop_status(loop), host="127.0.0.1", port=0).start()
    base = f"http://127.0.0.1:{probes.port}"
    try:
        assert _get(f"{base}/readyz") == (200, json.dumps({"status": "ready"}))
        assert _get(f"{base}/healthz")[0] == 200
        loop.request_drain()
        assert _get(f"{base}/readyz") == (503, json.dumps({"status": "draining"}))
        wait_until(loop.stopped.is_set, timeout=30, message="loop stopped")
        assert _get(f"{base}/readyz")[0] == 503
        assert _get(f"{base}/healthz") == (503, json.dumps({"status": "stopped"}))
        assert _get(f"{base}/nothing")[0] == 404
    finally:
        probes.stop()


def test_while_the_model_loads_the_worker_is_alive_but_not_ready():
    """gpuworker starts its probes before loading: 200 /healthz, 503 /readyz."""
    server = Command()._probes(
        {"metrics_port": _free_port(), "metrics_host": "127.0.0.1"}, lambda: Command._status({})
    )
    base = f"http://127.0.0.1:{server.port}"
    try:
        assert _get(f"{base}/healthz") == (200, json.dumps({"status": "loading"}))
        assert _get(f"{base}/readyz") == (503, json.dumps({"status": "loading"}))
        status, text = _get(f"{base}/metrics")
        assert status == 200 and "# TYPE" in text
    finally:
        server.stop()


def test_a_metrics_port_in_use_fails_before_the_model_loads():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(CommandError, match=f"--metrics-port {port}"):
            Command()._probes({"metrics_port": port, "metrics_host": "127.0.0.1"}, lambda: "x")


def test_no_metrics_port_by_default(settings):
    settings.WORKER_METRICS_PORT = 0
    assert Command()._probes({"metrics_port": None, "metrics_host": None}, lambda: "x") is None


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


# What Prometheus 2.x sends: OpenMetrics first.
PROMETHEUS_ACCEPT = (
    "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,"
    "text/plain;version=0.0.4;q=0.5,*/*;q=0.1"
)


def test_vllm_names_keep_their_colons_whatever_the_scraper_accepts():
    """prometheus-client's OpenMetrics output would write vllm_... sample names."""
    from gpuworkers.metrics import WorkerMetrics

    WorkerMetrics("colon-check").ttft.observe(0.3)
    server = ProbeServer(lambda: "ready", host="127.0.0.1", port=0).start()
    try:
        request = urllib.request.Request(
            f"http://127.0.0.1:{server.port}/metrics", headers={"Accept": PROMETHEUS_ACCEPT}
        )
        with urllib.request.urlopen(request, timeout=5) as response:
            assert response.headers["Content-Type"].startswith("text/plain")
            text = response.read().decode()
    finally:
        server.stop()
    assert 'vllm:time_to_first_token_seconds_count{engine="0",model_name="colon-check"} 1.0' in text
    assert "vllm_time_to_first_token" not in text
