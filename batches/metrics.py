"""The Batch API's Prometheus metrics (the Celery worker's /metrics, or the web's
in embedded mode). No tenant or batch labels: per-batch numbers are in the
batch rows.

- ``llmp_batch_lines_total{outcome}``: lines ended or put back, by outcome
  (``succeeded``, ``failed``, ``retry``: refused for capacity and queued
  again, ``stop``: the budget or quota ended the batch).
- ``llmp_batch_lines_running``: lines in flight in this process's feeders.
- ``llmp_batch_completion_tokens_total``: completion tokens of succeeded
  lines; its rate is the batch tokens/s.
- ``llmp_batch_duration_seconds{status}``: from created to the final
  status (completed, cancelled, expired).
"""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

LINES = Counter(
    "llmp_batch_lines", "Batch lines ended (or queued again), by outcome.", ("outcome",)
)
RUNNING = Gauge(
    "llmp_batch_lines_running",
    "Batch lines in flight in this process.",
    multiprocess_mode="livesum",
)
TOKENS = Counter("llmp_batch_completion_tokens", "Completion tokens of succeeded batch lines.")
DURATION = Histogram(
    "llmp_batch_duration_seconds",
    "From a batch's creation to its final status.",
    ("status",),
    buckets=(60, 300, 900, 1800, 3600, 3 * 3600, 6 * 3600, 12 * 3600, 24 * 3600, 48 * 3600),
)
