"""``manage.py gpuworker --model NAME``: one GPU worker process.

Loads the model, warms it up, registers as ready on the Redis bus and
serves until SIGTERM/SIGINT. The first signal drains (no new requests:
peers of the model take those still queued; running ones finish within
``WORKER_DRAIN_SECONDS``, then deregister and exit 0); a second one stops
at once.

The thin Django entry point of the worker: it reads settings and its
command line, and learns the rest (a deployment's weights, a model's path,
tier weights) from the control snapshot on Redis, never from the database.

``--metrics-port`` serves Prometheus metrics and the liveness/readiness
probes (``gpuworkers.probes``) from before the model loads; traces go where
the ``OTEL_*`` environment says (``wire.tracing``).
"""

from __future__ import annotations

import os
import signal
import socket
import threading
import time
import uuid
from decimal import Decimal, InvalidOperation
from pathlib import Path

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from gpuworkers import probes
from gpuworkers.scheduling import engine_scheduling_options, tier_weights_parse
from gpuworkers.worker import WorkerLoop
from wire.bus import BusUnavailable, get_worker_bus
from wire.snapshot import Snapshot, SnapshotReader, snapshot_store_for
from wire.tracing import tracing_configure


class Command(BaseCommand):
    help = "Serve one model from the Redis bus with the paged-KV engine."
    # Checks would import the URLconf (the whole API); a worker needs none of it.
    requires_system_checks: list[str] = []

    def add_arguments(self, parser) -> None:
        parser.add_argument("--model", required=True, help="served model name")
        parser.add_argument("--worker-id", default=None, help="default: host-pid-random")
        parser.add_argument(
            "--dtype", default=None, help="auto (default), float32, bfloat16 or float16"
        )
        parser.add_argument("--kv-cache-mb", type=int, default=None, help="KV cache size")
        parser.add_argument("--threads", type=int, default=None, help="torch CPU threads")
        parser.add_argument("--device", default="cpu", help="cpu or cuda")
        parser.add_argument(
            "--model-version",
            default="",
            help="model version reported to the router (rollouts); --version is Django's",
        )
        parser.add_argument(
            "--deployment",
            default=None,
            help="MODEL@VERSION of a fleet deployment: its version and weights path, "
            "from the control snapshot",
        )
        parser.add_argument(
            "--model-path",
            default=None,
            help="Hugging Face directory of the weights "
            "(default: the snapshot's catalog entry; the demo model for its name)",
        )
        parser.add_argument(
            "--tier-weights",
            default=None,
            help="fair-share weights used until a control snapshot is published, "
            "e.g. enterprise=0.5,pro=0.35,free=0.15 (default: the engine's)",
        )
        parser.add_argument(
            "--hourly-price",
            default=None,
            help="this deployment's GPU price per hour, for cost reports "
            "(default: settings.WORKER_HOURLY_PRICE, env WORKER_HOURLY_PRICE)",
        )
        parser.add_argument(
            "--scheduling-policy",
            default=None,
            choices=["fair", "priority", "fcfs"],
            help="default: settings.ENGINE_SCHEDULING_POLICY",
        )
        parser.add_argument(
            "--metrics-port",
            type=int,
            default=None,
            help="port of /metrics, /healthz and /readyz; 0 = none "
            "(default: settings.WORKER_METRICS_PORT, env WORKER_METRICS_PORT)",
        )
        parser.add_argument(
            "--metrics-host",
            default=None,
            help="address the metrics port binds (default: settings.WORKER_METRICS_HOST)",
        )

    def handle(self, *args, **options) -> None:
        if not settings.REDIS_URL:
            raise CommandError("gpuworker serves from Redis: set REDIS_URL")
        hourly_price = self._hourly_price(options)  # before minutes of loading
        fallback_weights = self._tier_weights(options)
        tracing_configure(service_name="llm-platform-gpuworker")
        # The probes answer from before the model loads: alive, not ready.
        holder: dict[str, WorkerLoop] = {}
        probe_server = self._probes(options, lambda: self._status(holder))
        snapshot = self._snapshot()
        name = options["model"]
        worker_id = options["worker_id"] or (
            f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        )
        threads = options["threads"] if options["threads"] is not None else settings.ENGINE_THREADS
        if threads:
            import torch

            torch.set_num_threads(threads)
        version, weights = self._deployment(name, options, snapshot)
        model_dir = weights or self._model_dir(name, options, snapshot)
        scheduling = engine_scheduling_options(
            options["scheduling_policy"] or settings.ENGINE_SCHEDULING_POLICY,
            snapshot=snapshot,
            fallback_weights=fallback_weights,
        )
        engine = self._load(name, model_dir, options, scheduling)
        loop = WorkerLoop(
            engine,
            get_worker_bus(),
            worker_id,
            name,
            hourly_price=hourly_price,
            version=version,
            drain_seconds=float(settings.WORKER_DRAIN_SECONDS),
        )
        holder["loop"] = loop
        self._install_signals(loop)
        self._say(f"worker {worker_id}: warming up")
        started = time.monotonic()

        def announce() -> None:
            loop.ready.wait()
            if not loop.stopped.is_set():
                self._say(f"worker {worker_id}: ready ({time.monotonic() - started:.1f}s warm-up)")

        threading.Thread(target=announce, daemon=True).start()
        try:
            loop.run()
        except BusUnavailable as exc:
            raise CommandError(f"worker {worker_id}: {exc}") from exc
        finally:
            if probe_server is not None:
                probe_server.stop()
        self._say(f"worker {worker_id}: stopped")

    def _probes(self, options, status) -> probes.ProbeServer | None:
        port = options["metrics_port"]
        port = settings.WORKER_METRICS_PORT if port is None else port
        if not port:
            return None
        host = options["metrics_host"] or settings.WORKER_METRICS_HOST
        try:
            server = probes.ProbeServer(status, host=host, port=port).start()
        except OSError as exc:
            raise CommandError(f"--metrics-port {port}: {exc}") from exc
        self._say(f"metrics and probes on http://{host}:{server.port}/metrics")
        return server

    @staticmethod
    def _status(holder: dict[str, WorkerLoop]) -> str:
        loop = holder.get("loop")
        return probes.LOADING if loop is None else probes.loop_status(loop)

    def _snapshot(self) -> Snapshot | None:
        """The published control snapshot, or None when there is none (yet)."""
        reader = SnapshotReader(
            lambda: snapshot_store_for(settings.REDIS_URL, settings.FLEET_SNAPSHOT_KEY),
            refresh=lambda: 0.0,
        )
        snapshot = reader.current()
        if reader.last_error:
            self._say(f"control snapshot: {reader.last_error}")
        return snapshot

    def _deployment(self, name: str, options, snapshot: Snapshot | None) -> tuple[str, Path | None]:
        """(version, weights directory or None) from --deployment or --model-version."""
        if not options["deployment"]:
            return options["model_version"], None
        model, _, version = options["deployment"].partition("@")
        if model != name or not version:
            raise CommandError(f"--deployment must be {name}@VERSION")
        found = (
            next((d for d in snapshot.deployments_of(model) if d.version == version), None)
            if snapshot is not None
            else None
        )
        if found is None:
            raise CommandError(
                f"no deployment {model}@{version} in the control snapshot:"
                " run manage.py fleet deploy (it publishes one)"
            )
        weights = Path(found.weights_path) if found.weights_path else None
        if weights is not None and not weights.is_dir():
            raise CommandError(f"deployment {model}@{version}: {weights} is not a directory")
        return version, weights

    def _hourly_price(self, options) -> str:
        raw = options["hourly_price"] or settings.WORKER_HOURLY_PRICE or "0"
        try:
            price = Decimal(raw)
        except InvalidOperation:
            price = Decimal(-1)
        if not price.is_finite() or price < 0:
            raise CommandError(f"--hourly-price must be a non-negative number, not {raw!r}")
        return str(price)

    def _tier_weights(self, options) -> dict[str, float] | None:
        if not options["tier_weights"]:
            return None
        try:
            return tier_weights_parse(options["tier_weights"])
        except ValueError as exc:
            raise CommandError(f"--tier-weights: {exc}") from None

    def _model_dir(self, name: str, options, snapshot: Snapshot | None) -> Path:
        if options["model_path"]:
            path = Path(options["model_path"])
        else:
            entry = snapshot.models.get(name) if snapshot is not None else None
            if entry is None and name != settings.DEMO_MODEL_NAME:
                raise CommandError(
                    f"unknown model {name!r}: not in the control snapshot's catalog;"
                    " pass --model-path"
                )
            if entry is None or not entry.path:
                from gpuworkers.engine.convert_gguf import ensure_demo_model

                self._say(f"model {name}: demo model (converting on first use)")
                return ensure_demo_model()
            path = Path(entry.path)
        if not path.is_dir():
            raise CommandError(f"model {name!r}: {path} is not a directory")
        return path

    def _load(self, name: str, model_dir: Path, options, scheduling: dict):
        from gpuworkers.engine import LLMEngine

        dtype = options["dtype"] or settings.ENGINE_DTYPE
        kv_mb = options["kv_cache_mb"] or settings.ENGINE_KV_CACHE_MB
        kv_dtype = settings.ENGINE_KV_CACHE_DTYPE
        self._say(f"model {name}: loading {model_dir} ({dtype}, {kv_mb} MiB {kv_dtype} KV cache)")
        started = time.monotonic()
        engine = LLMEngine.from_pretrained(
            model_dir,
            dtype=dtype,
            kv_cache_bytes=kv_mb << 20,
            kv_cache_dtype=kv_dtype,
            max_num_batched_tokens=settings.ENGINE_MAX_BATCHED_TOKENS,
            quantization=settings.ENGINE_QUANTIZATION,
            model_id=name,
            batch_step_tokens=settings.ENGINE_BATCH_STEP_TOKENS,
            batch_yield_seconds=settings.ENGINE_BATCH_YIELD_SECONDS,
            device=options["device"],
            **scheduling,
        )
        fast_paths = ", ".join(engine.cpu_fast_paths) or "none"
        self._say(
            f"model {name}: loaded in {time.monotonic() - started:.1f}s"
            f" ({engine.config.dtype}, {engine.config.quantization or 'unquantized'} weights;"
            f" CPU fast paths: {fast_paths})"
        )
        return engine

    def _install_signals(self, loop: WorkerLoop) -> None:
        def on_signal(signum, frame) -> None:
            if loop.state == "draining":
                self._say("second signal: stopping now")
                loop.request_stop()
            else:
                self._say(f"{signal.Signals(signum).name}: draining")
                loop.request_drain()

        signal.signal(signal.SIGTERM, on_signal)
        signal.signal(signal.SIGINT, on_signal)

    def _say(self, message: str) -> None:
        self.stdout.write(f"[gpuworker] {message}")
        self.stdout.flush()
