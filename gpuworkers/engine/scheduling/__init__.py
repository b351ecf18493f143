"""The scheduler, its policies, and the batch it hands the model runner.

Plain Python (no torch): testable with tiny pools and no model.

- ``scheduler.py``: ``Scheduler``, the step's plan and its bookkeeping.
- ``batch.py``: ``ScheduledBatch``, the runner's snapshot of a step.
- ``policy.py``: the ``SchedulingPolicy`` interface, FCFS and Priority.
- ``fair_policy.py``: Fair: tiers by weight, tenants by counter, batch last;
  ``fair_share.py`` (tier accounting), ``tenant_counters.py`` (virtual token
  counters), ``fair_queue.py`` (a tier's fair order), ``fair_victims.py``
  (whom a claim preempts), ``fair_estimate.py`` (the order's estimate for
  admission control).
- ``capacity.py``: KV reservations and admission checks.
"""

from gpuworkers.engine.scheduling.batch import CacheOps, SampleInput, ScheduledBatch, ScheduledSeq
from gpuworkers.engine.scheduling.fair_policy import FairPolicy
from gpuworkers.engine.scheduling.fair_share import FairShare
from gpuworkers.engine.scheduling.policy import (
    FCFSPolicy,
    PriorityPolicy,
    Queues,
    SchedulingPolicy,
)
from gpuworkers.engine.scheduling.scheduler import Scheduler, make_policy

__all__ = [
    "CacheOps",
    "FCFSPolicy",
    "FairPolicy",
    "FairShare",
    "PriorityPolicy",
    "Queues",
    "SampleInput",
    "ScheduledBatch",
    "ScheduledSeq",
    "Scheduler",
    "SchedulingPolicy",
    "make_policy",
]
