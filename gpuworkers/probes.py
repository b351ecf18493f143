"""The worker's metrics port: ``/metrics``, ``/healthz`` and ``/readyz``.

``gpuworker --metrics-port N`` serves it from a thread of its own, started
before the model loads, so an orchestrator sees the process alive while it
loads and warms up:

- ``/metrics``: the process's Prometheus registry (``gpuworkers.metrics``),
  through prometheus-client's own WSGI app (gzip), always in the text
  format: prometheus-client 0.26's OpenMetrics output, which Prometheus
  asks for first, turns the colons of vLLM's names into underscores in
  sample lines (prometheus/client_python#1177), so dashboards would find
  nothing; its text format keeps them.
- ``/healthz``: 200 while the process serves or is getting ready; 503 once
  the loop has stopped (the process is about to exit).
- ``/readyz``: 200 only while the worker is warm and taking requests; 503
  while loading, warming up or draining.

The embedded worker has no port of its own: its metrics are in the web's
``/metrics`` and its readiness in the web's ``/readyz``.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable, Iterable
from socketserver import ThreadingMixIn
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import REGISTRY, CollectorRegistry, make_wsgi_app

logger = logging.getLogger(__name__)

# What ``status()`` may answer, in the order a worker goes through them.
LOADING, WARMING, READY, DRAINING, STOPPED = "loading", "warming", "ready", "draining", "stopped"


class _Server(ThreadingMixIn, WSGIServer):
    daemon_threads = True
    # A restarted worker must get its port back at once.
    allow_reuse_address = True


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format, *args) -> None:  # noqa: A002 (the stdlib's name)
        pass  # a scrape every few seconds is not worth a log line


class ProbeServer:
    """Serve the probes for a worker whose state ``status()`` reports."""

    def __init__(
        self,
        status: Callable[[], str],
        *,
        host: str = "0.0.0.0",
        port: int,
        registry: CollectorRegistry = REGISTRY,
    ):
        self.status = status
        self._metrics = make_wsgi_app(registry)
        # Binds now, so a port in use fails before minutes of model loading.
        self._server = make_server(host, port, self._app, _Server, _QuietHandler)
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="probes", daemon=True
        )

    def start(self) -> ProbeServer:
        self._thread.start()
        logger.info("metrics and probes on port %d", self.port)
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def _app(self, environ, start_response) -> Iterable[bytes]:
        path = environ.get("PATH_INFO", "")
        if path == "/metrics":
            text_only = {k: v for k, v in environ.items() if k != "HTTP_ACCEPT"}
            return self._metrics(text_only, start_response)
        if path not in ("/healthz", "/readyz"):
            return _json(start_response, 404, {"error": "not found"})
        state = self.status()
        ok = state == READY if path == "/readyz" else state != STOPPED
        return _json(start_response, 200 if ok else 503, {"status": state})


def _json(start_response, code: int, body: dict) -> list[bytes]:
    payload = json.dumps(body).encode()
    reason = {200: "OK", 404: "Not Found", 503: "Service Unavailable"}[code]
    start_response(
        f"{code} {reason}",
        [("Content-Type", "application/json"), ("Content-Length", str(len(payload)))],
    )
    return [payload]


def loop_status(loop) -> str:
    """A ``WorkerLoop``'s state as the probes report it."""
    if loop.stopped.is_set():
        return STOPPED
    if not loop.ready.is_set():
        return WARMING
    return READY if loop.state == "ready" else DRAINING
