"""Worker info: what a worker says about itself in every heartbeat."""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
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
        data = dict(data)
        data["state"] = WorkerState(data["state"])
        return cls(**data)
