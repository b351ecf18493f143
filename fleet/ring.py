"""A consistent-hash ring with virtual nodes.

Each replica owns ``vnodes`` points on a 64-bit circle; a key belongs to
the first point clockwise of its hash. A replica that joins takes over only
the arcs in front of its own points, about 1/N of the keys, and one that
leaves hands only its arcs to the next points: the other conversations keep
their replica and the KV cache it holds.

Written here rather than taken from uhashring: the router needs the
ordered, distinct successors of a key (the fallback candidates), and a
ring rebuilt from a membership set on every heartbeat change, which is a
bisect over a sorted list.
"""

from __future__ import annotations

import bisect
import hashlib
from collections.abc import Iterable


def ring_hash(value: str) -> int:
    """A stable 64-bit hash (Python's hash() is salted per process)."""
    return int.from_bytes(hashlib.blake2b(value.encode(), digest_size=8).digest(), "big")


class HashRing:
    """Nodes on a circle; ``successors(key, k)`` lists the first k distinct ones."""

    __slots__ = ("_hashes", "_owners", "nodes", "vnodes")

    def __init__(self, nodes: Iterable[str] = (), *, vnodes: int = 64):
        if vnodes < 1:
            raise ValueError("vnodes must be at least 1")
        self.vnodes = vnodes
        self.nodes: frozenset[str] = frozenset(nodes)
        points = sorted(
            (ring_hash(f"{node}#{i}"), node) for node in self.nodes for i in range(vnodes)
        )
        self._hashes = [h for h, _ in points]
        self._owners = [node for _, node in points]

    def __len__(self) -> int:
        return len(self.nodes)

    def get(self, key: str) -> str | None:
        """The node owning ``key``; None on an empty ring."""
        found = self.successors(key, 1)
        return found[0] if found else None

    def successors(self, key: str, count: int) -> list[str]:
        """Up to ``count`` distinct nodes clockwise from ``key``, owner first."""
        if not self._hashes:
            return []
        count = min(count, len(self.nodes))
        start = bisect.bisect_right(self._hashes, ring_hash(key))
        found: list[str] = []
        size = len(self._owners)
        for step in range(size):
            node = self._owners[(start + step) % size]
            if node not in found:
                found.append(node)
                if len(found) == count:
                    break
        return found
