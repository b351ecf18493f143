"""Billing's Prometheus series: usage settlement.

- ``llmp_usage_settled_total{outcome}``: usage-stream entries settled by
  the settler: ``recorded`` (it wrote the record) or ``known`` (the web
  tier's fast path, or an earlier delivery, had).
- ``llmp_usage_dead_letters_total{reason}``: entries set aside
  (``UsageDeadLetter`` rows, in the admin).
- ``llmp_usage_stream_backlog``: entries not yet settled, at the last run.
"""

from prometheus_client import Counter, Gauge

SETTLED = Counter("llmp_usage_settled", "Usage-stream entries settled.", ("outcome",))
DEAD_LETTERS = Counter(
    "llmp_usage_dead_letters", "Usage-stream entries set aside as poison.", ("reason",)
)
BACKLOG = Gauge("llmp_usage_stream_backlog", "Usage-stream entries not yet settled.")
