"""Embedded mode's usage stream: the Redis group's semantics in one process.

The embedded worker's thread appends; the in-process settler reads. Entries
are kept as JSON text, as Redis keeps them.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass

from wire.usage.base import CLAIM_IDLE_MS, Delivery
from wire.usage.entry import UsageEntry


@dataclass(slots=True)
class _Pending:
    consumer: str
    delivered_at: float  # monotonic seconds


class MemoryUsageStream:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        # Ids look like Redis' ("<ms>-<n>"), the stream's creation time
        # first, so that ids from an earlier process are not reused.
        self._epoch = int(time.time() * 1000)
        self._numbers = itertools.count(1)
        # Insertion-ordered: entry id -> payload (None: not a usage entry).
        self._entries: dict[str, str | None] = {}
        self._pending: dict[str, _Pending] = {}
        # Highest id delivered to the group (Redis' last-delivered-id).
        self._delivered = 0

    def append(self, entries: Sequence[UsageEntry]) -> None:
        self.append_raw([entry.to_json() for entry in entries])

    def append_raw(self, payloads: Sequence[str | None]) -> None:
        """Append payloads as they are (tests write malformed entries with it)."""
        with self._lock:
            for payload in payloads:
                self._entries[f"{self._epoch}-{next(self._numbers)}"] = payload

    def read(self, consumer: str, count: int, min_idle_ms: int = CLAIM_IDLE_MS) -> list[Delivery]:
        now = time.monotonic()
        with self._lock:
            out: list[Delivery] = []
            for entry_id, pending in self._pending.items():
                if len(out) >= count:
                    break
                if (now - pending.delivered_at) * 1000 >= min_idle_ms:
                    self._pending[entry_id] = _Pending(consumer, now)
                    out.append(Delivery(entry_id, self._entries[entry_id]))
            for entry_id, payload in self._entries.items():
                if len(out) >= count:
                    break
                number = int(entry_id.rpartition("-")[2])
                if number > self._delivered:
                    self._delivered = number
                    self._pending[entry_id] = _Pending(consumer, now)
                    out.append(Delivery(entry_id, payload))
            return out

    def ack(self, entry_ids: Sequence[str]) -> None:
        with self._lock:
            for entry_id in entry_ids:
                self._pending.pop(entry_id, None)
                self._entries.pop(entry_id, None)

    def size(self) -> int:
        with self._lock:
            return len(self._entries)
