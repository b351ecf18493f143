"""One step's startable sequences of one counter group, in the fair order.

A group is a tier (interactive) or the batch lane. Its next sequence is
the head of its tenant with the lowest virtual token counter; within a
tenant, queue order (swapped first, then class, priority, arrival).

A head that does not fit ends its tenant's turn for the step (strict order
within a tenant). The group's other tenants may still start, but only
while their counters are within ``slack`` of the blocked tenant's: a
light tenant's short request need not wait behind a long prompt that waits
for KV, and the blocked tenant is overtaken by a bounded amount of service
only (every start charges its tenant), after which the group waits for
room for it. Without a bound a stream of small requests could keep a long
one out forever.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from gpuworkers.engine.scheduling.tenant_counters import TenantCounters, TenantKey
from gpuworkers.engine.sequence import Sequence


class GroupQueue:
    def __init__(
        self,
        group: str,
        counters: TenantCounters,
        usage: dict[TenantKey, float],
        slack: float,
        queue_key: Callable[[Sequence], object],
    ):
        self.group = group
        self.counters = counters
        self.usage = usage
        self.slack = slack
        self.queue_key = queue_key
        # Each tenant's sequences in queue order (added sorted).
        self.by_tenant: dict[TenantKey, list[Sequence]] = {}
        # Tenants above this counter wait (a blocked tenant's + slack).
        self.limit = float("inf")

    def add(self, key: TenantKey, seq: Sequence) -> None:
        """Append ``seq`` (callers add in queue order)."""
        self.by_tenant.setdefault(key, []).append(seq)

    def __bool__(self) -> bool:
        return bool(self.by_tenant)

    def sequences(self) -> Iterator[Sequence]:
        for queue in self.by_tenant.values():
            yield from queue

    def head(self) -> Sequence | None:
        """The next sequence to offer, or None if no tenant may start.

        Lowest counter first. Ties (a newcomer is lifted to exactly the
        least-served counter): the tenant holding less now, then the
        shorter head, then queue order, so that a light tenant's short
        request is not held behind a tied long prompt.
        """
        best, best_key = None, None
        for key, queue in self.by_tenant.items():
            counter = self.counters.counter(self.group, key)
            if counter > self.limit:
                continue
            head = queue[0]
            rank = (
                counter,
                self.usage.get(key, 0.0),
                head.num_uncomputed_tokens,
                self.queue_key(head),
            )
            if best_key is None or rank < best_key:
                best, best_key = head, rank
        return best

    def started(self, key: TenantKey) -> None:
        """The tenant's head started."""
        queue = self.by_tenant[key]
        queue.pop(0)
        if not queue:
            del self.by_tenant[key]

    def blocked(self, key: TenantKey) -> list[Sequence]:
        """The tenant's head did not fit: the tenant starts nothing more
        this step, the others only within the slack. Returns the tenant's
        sequences after the head (no longer startable this step)."""
        queue = self.by_tenant.pop(key)
        counter = self.counters.counter(self.group, key)
        self.limit = min(self.limit, counter + self.slack)
        return queue[1:]
