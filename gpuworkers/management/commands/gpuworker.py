"""``manage.py gpuworker --model NAME``: one GPU worker process.

Loads the model, warms it up, registers as ready on the Redis bus and
serves until SIGTERM/SIGINT. The first signal drains (no new requests,
running ones finish, then deregister); a second one stops at once.
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

from gpuworkers.scheduling import engine_scheduling_options
from gpuworkers.worker import WorkerLoop
from inference.bus import get_worker_bus
from inference.bus.base import BusUnavailable


class Command(BaseCommand):
    help = "Serve one model from the Redis bus with the paged-KV engine."
    # Checks would import the URLconf (the whole API); a worker needs none of it.
    requires_system_checks: list[str] = []

    def add_arguments(self, parser) -> None:
        parser.add_argument("--model", required=True, help="served model name")
        parser.add_argument("--worker-id", default=None, help="default: host-pid-random")
        parser.add_argument("--dtype", default=None, help="float32, bfloat16 or float16")
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
            help="MODEL@VERSION of a fleet Deployment: its version and weights path",
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

    def handle(self, *args, **options) -> None:
        if not settings.REDIS_URL:
            raise CommandError("gpuworker serves from Redis: set REDIS_URL")
        hourly_price = self._hourly_price(options)  # before minutes of loading
        name = options["model"]
        worker_id = options["worker_id"] or (
            f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        )
        threads = options["threads"] if options["threads"] is not None else settings.ENGINE_THREADS
        if threads:
            import torch

            torch.set_num_threads(threads)
        version, weights = self._deployment(name, options)
        model_dir = weights or self._model_dir(name)
        engine = self._load(name, model_dir, options)
        loop = WorkerLoop(
            engine, get_worker_bus(), worker_id, name, hourly_price=hourly_price, version=version
        )
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
        self._say(f"worker {worker_id}: stopped")

    def _deployment(self, name: str, options) -> tuple[str, Path | None]:
        """(version, weights directory or None) from --deployment or --version."""
        if not options["deployment"]:
            return options["model_version"], None
        model, _, version = options["deployment"].partition("@")
        if model != name or not version:
            raise CommandError(f"--deployment must be {name}@VERSION")
        # Start-up only: the serving path never reads the database.
        from fleet.models import Deployment

        row = Deployment.objects.filter(model_name=model, version=version).first()
        if row is None:
            raise CommandError(f"no deployment {model}@{version}: run manage.py fleet deploy")
        weights = Path(row.weights_path) if row.weights_path else None
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

    def _model_dir(self, name: str) -> Path:
        if name == settings.DEMO_MODEL_NAME:
            from gpuworkers.engine.convert_gguf import ensure_demo_model

            self._say(f"model {name}: demo model (converting on first use)")
            return ensure_demo_model()
        # Imported here: the request path of the worker never touches the ORM.
        from inference.models import ServedModel

        row = ServedModel.objects.filter(name=name).first()
        if row is None:
            raise CommandError(f"unknown model {name!r}: no ServedModel row")
        if not row.path:
            from gpuworkers.engine.convert_gguf import ensure_demo_model

            return ensure_demo_model()
        path = Path(row.path)
        if not path.is_dir():
            raise CommandError(f"model {name!r}: {path} is not a directory")
        return path

    def _load(self, name: str, model_dir: Path, options):
        from gpuworkers.engine import LLMEngine

        dtype = options["dtype"] or settings.ENGINE_DTYPE
        kv_mb = options["kv_cache_mb"] or settings.ENGINE_KV_CACHE_MB
        self._say(f"model {name}: loading {model_dir} ({dtype}, {kv_mb} MiB KV cache)")
        started = time.monotonic()
        engine = LLMEngine.from_pretrained(
            model_dir,
            dtype=dtype,
            kv_cache_bytes=kv_mb << 20,
            max_num_batched_tokens=settings.ENGINE_MAX_BATCHED_TOKENS,
            model_id=name,
            device=options["device"],
            **engine_scheduling_options(options["scheduling_policy"]),
        )
        fast_paths = ", ".join(engine.cpu_fast_paths) or "none"
        self._say(
            f"model {name}: loaded in {time.monotonic() - started:.1f}s"
            f" (CPU fast paths: {fast_paths})"
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
