"""The request path's Prometheus metrics, served at the web's ``/metrics``.

Labels are the tier, the service tier (OpenAI's ``service_tier`` as
served: priority, default, flex, batch) and the model, never a tenant or
key id: those would
make a series per customer (unbounded cardinality), and per-tenant
numbers already live in the usage tables.

- ``llmp_requests_refused_total{reason,tier,model}``: 429s before any GPU
  work, by reason: ``requests``, ``tokens``, ``concurrency`` (rate
  limits), ``quota`` (monthly tokens), ``budget`` (monthly spend: the
  budget refusals), ``queue_wait`` (admission control's SLA),
  ``flex_capacity`` (service_tier flex turned away by a deep queue). API
  and console alike.
- ``llmp_streams_open{model}``: responses whose events a relay is reading
  (SSE, JSON and console replies, resumes included).
- ``llmp_responses_total{model,status}``: responses ended, by terminal
  event (completed, incomplete, failed, cancelled): the error rate.
- ``llmp_relay_lag_seconds{model}``: from the worker ending a response to
  the relay reading that end (bus and event-loop delay; the worker's clock
  against the web's).
- ``llmp_usage_settlement_lag_seconds{model}``: from the worker ending a
  response to its usage record written and its rate limits settled.
- ``llmp_time_to_first_token_seconds{tier,service_tier,model}``: from the web enqueuing
  a request to its relay reading the first token, on the web's clock (the
  worker's ``vllm:time_to_first_token_seconds`` has no tier). Per-tier SLOs
  are alerted on it (docker/prometheus/alerts.yml).
- ``llmp_queue_wait_seconds{tier,service_tier,model}``: from the web enqueuing a request
  to the engine first scheduling it (the terminal event's
  ``queue_time_ms``), where admission control's tier SLA applies.

Both use vLLM's TTFT buckets (``wire.buckets``): queue waits are mostly
milliseconds, which vLLM's coarser request-latency buckets would lose.
"""

from __future__ import annotations

import time

from prometheus_client import Counter, Gauge, Histogram

from wire.buckets import TTFT_BUCKETS
from wire.events import Terminal

LAG_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)

REFUSED = Counter(
    "llmp_requests_refused",
    "Requests refused with a 429 before any GPU work, by reason.",
    ("reason", "tier", "model"),
)
STREAMS_OPEN = Gauge("llmp_streams_open", "Responses whose events a relay is reading.", ("model",))
RESPONSES = Counter(
    "llmp_responses", "Responses ended, by terminal event type.", ("model", "status")
)
RELAY_LAG = Histogram(
    "llmp_relay_lag_seconds",
    "From the worker ending a response to the relay reading its end.",
    ("model",),
    buckets=LAG_BUCKETS,
)
SETTLEMENT_LAG = Histogram(
    "llmp_usage_settlement_lag_seconds",
    "From the worker ending a response to its usage record written and limits settled.",
    ("model",),
    buckets=LAG_BUCKETS,
)

FIRST_TOKEN_TIME = Histogram(
    "llmp_time_to_first_token_seconds",
    "From the web enqueuing a request to its relay reading the first token, by tier.",
    ("tier", "service_tier", "model"),
    buckets=TTFT_BUCKETS,
)
QUEUE_WAIT_TIME = Histogram(
    "llmp_queue_wait_seconds",
    "From the web enqueuing a request to the engine first scheduling it, by tier.",
    ("tier", "service_tier", "model"),
    buckets=TTFT_BUCKETS,
)

# Rate limiter outcomes (tenants.ratelimit.Decision.outcome) are reasons as is.
BUDGET, QUEUE_WAIT, FLEX_CAPACITY = "budget", "queue_wait", "flex_capacity"


def request_refused(*, reason: str, tier: str, model: str) -> None:
    REFUSED.labels(reason, tier, model).inc()


def worker_ended_at(terminal: Terminal, *, sent_at: float | None) -> float | None:
    """When the worker ended the response, on its clock; None if it did not.

    The terminal event's duration runs from the enqueue (``sent_at``,
    ``GenerationRequest.created_at``); resumes know no ``sent_at`` and
    endings the web tier wrote have no duration.
    """
    duration_ms = terminal.metrics.duration_ms
    if sent_at is None or not duration_ms:
        return None
    return sent_at + duration_ms / 1000


def lag_observe(histogram: Histogram, model: str, ended_at: float | None) -> None:
    """Seconds from ``ended_at`` to now, when there is an ``ended_at``."""
    if ended_at is not None:
        histogram.labels(model).observe(max(time.time() - ended_at, 0.0))


def first_token_observe(
    *, tier: str, model: str, sent_at: float, service_tier: str = "default"
) -> None:
    FIRST_TOKEN_TIME.labels(tier, service_tier, model).observe(max(time.time() - sent_at, 0.0))


def queue_wait_observe(
    *, tier: str, model: str, terminal: Terminal, service_tier: str = "default"
) -> None:
    """The terminal event's queue time, when the engine scheduled the request."""
    queue_ms = terminal.metrics.queue_time_ms
    if queue_ms is not None:
        QUEUE_WAIT_TIME.labels(tier, service_tier, model).observe(queue_ms / 1000)
