"""Worker info: what a worker says about itself in every heartbeat."""

from __future__ import annotations

import json
import logging
import time
from dataclasses import asdict, dataclass, field, fields
from enum import StrEnum
from typing import Any


class WorkerState(StrEnum):
    WARMING = "warming"
    READY = "ready"
    DRAINING = "draining"


@dataclass(slots=True)
class WorkerInfo:
    """A worker's heartbeat: who it is, what it serves and how loaded it is."""

    worker_id: str
    model: str
    state: WorkerState
    # The deployment's model version (rollouts route by it); "" when unversioned.
    version: str = ""
    running: int = 0
    waiting: int = 0
    swapped: int = 0
    kv_blocks_used: int = 0
    kv_blocks_total: int = 0
    queued_tokens: int = 0
    # Recent decode rate, for admission's wait estimate.
    tokens_per_second: float = 0.0
    heartbeat_at: float = field(default_factory=time.time)
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def kv_usage(self) -> float:
        return self.kv_blocks_used / self.kv_blocks_total if self.kv_blocks_total else 0.0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> WorkerInfo:
        """The info a registry record holds; fields this version does not
        know are dropped, so a newer worker's heartbeat (rolling deploys)
        cannot break routing on an older web process."""
        known = {k: v for k, v in data.items() if k in _FIELD_NAMES}
        known["state"] = WorkerState(known["state"])
        return cls(**known)


_FIELD_NAMES = frozenset(f.name for f in fields(WorkerInfo))

logger = logging.getLogger(__name__)


def decode_registry(records: dict[str, str]) -> list[WorkerInfo]:
    """The workers a registry's JSON records describe, skipping (and logging)
    any record that cannot be read, so one bad entry drops that worker from
    routing rather than failing every lookup."""
    workers = []
    for worker_id, text in records.items():
        try:
            workers.append(WorkerInfo.from_dict(json.loads(text)))
        except (ValueError, TypeError, KeyError, AttributeError) as exc:
            logger.warning("unreadable registry record for worker %s: %r", worker_id, exc)
    return workers
