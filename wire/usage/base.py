"""The usage stream's interface: append on the worker, consume in a group.

Entries are read by a consumer group: each one is delivered to one
settler, stays pending until that settler acknowledges it, and is handed
to another settler (claimed) once it has been pending longer than
``min_idle_ms``, so a settler that dies mid-batch loses nothing. An
acknowledged entry is deleted: the stream holds only unsettled usage.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from wire.usage.entry import UsageEntry

STREAM_KEY = "llm:usage"
GROUP = "settlers"
# An entry pending this long belongs to a settler presumed dead.
CLAIM_IDLE_MS = 60_000


@dataclass(slots=True, frozen=True)
class Delivery:
    """One entry as read from the stream: its id and its raw JSON text."""

    entry_id: str
    # None when the entry has no "u" field (written by something else).
    payload: str | None


class UsageStream(Protocol):
    def append(self, entries: Sequence[UsageEntry]) -> None:
        """Append entries in one round trip; raises BusUnavailable when unreachable."""
        ...

    def read(self, consumer: str, count: int, min_idle_ms: int = CLAIM_IDLE_MS) -> list[Delivery]:
        """Up to ``count`` entries for ``consumer``: first those pending longer
        than ``min_idle_ms`` on any consumer (claimed), then new ones."""
        ...

    def ack(self, entry_ids: Sequence[str]) -> None:
        """Settled (or set aside): never deliver these again."""
        ...

    def size(self) -> int:
        """Entries not yet acknowledged (pending or new)."""
        ...
