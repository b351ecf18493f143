"""Virtual token counters: fair share between tenants (VTC).

After Sheng et al., "Fairness in Serving Large Language Models" (OSDI
2024). Each tenant has a counter, charged with the weighted prompt and
output tokens computed for it; the tenant with the lowest counter goes
next. A tenant that becomes active (queued or running work after a step
with none) is lifted to the group's *floor*, the lowest counter among the
tenants that stayed active: idle time banks no credit, and a tenant that
leaves keeps what it was charged, so it cannot reset its debt by pausing.

Counters live in groups (a tier, or the engine-wide batch lane) and are
compared only within one. The floor never goes down; a departed tenant at
or under it is forgotten (it would be lifted to the floor anyway), and a
group with no active tenant forgets everyone: nobody waits, so there is
no unfairness left to remember. Memory is bounded by the active tenants
plus the departed ones served more than the least-served active one.

Plain bookkeeping: which tenants are active and how many tokens were
computed come from the caller.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from gpuworkers.engine.sequence import Sequence

TenantKey = tuple[str, str]  # (tier, tenant); tenant "" is the anonymous one
# The batch lane's group (the tiers are the interactive groups); a separate
# TenantCounters instance, so no tier name can collide with it.
BATCH_GROUP = "batch"


def tenant_key(seq: Sequence, tier: str) -> TenantKey:
    """The tenant ``seq`` is counted under within ``tier``."""
    return (tier, seq.request.tenant or "")


class TenantCounters:
    def __init__(self, prompt_weight: float, output_weight: float):
        self.prompt_weight = prompt_weight
        self.output_weight = output_weight
        self.counters: dict[str, dict[TenantKey, float]] = {}
        self.floors: dict[str, float] = {}
        self.active: dict[str, frozenset[TenantKey]] = {}

    def observe(self, active: Mapping[str, Iterable[TenantKey]]) -> None:
        """Start a step with ``active`` tenants per group: lift the newcomers
        to their group's floor, forget departed tenants at or under it."""
        for group in sorted(set(active) | set(self.active)):
            now = frozenset(active.get(group, ()))
            before = self.active.get(group, frozenset())
            counters = self.counters.setdefault(group, {})
            floor = self.floors.get(group, 0.0)
            if not now:
                # Nobody waits in this group: forget everyone, start level.
                floor = max([floor, *counters.values()])
                counters.clear()
            else:
                # The least-served of those who stayed (or, after a complete
                # turnover, of those who just left): newcomers start there.
                reference = (now & before) or before
                if reference:
                    floor = max(floor, min(counters.get(k, floor) for k in reference))
                for key in now - before:
                    counters[key] = max(counters.get(key, floor), floor)
                # Idle tenants the floor has reached: they would start there.
                for key in [k for k, c in counters.items() if c <= floor and k not in now]:
                    del counters[key]
            self.floors[group] = floor
        self.active = {g: frozenset(keys) for g, keys in active.items() if keys}

    def counter(self, group: str, key: TenantKey) -> float:
        """The tenant's counter (the group's floor for one never charged)."""
        counters = self.counters.get(group)
        floor = self.floors.get(group, 0.0)
        return counters.get(key, floor) if counters else floor

    def floor(self, group: str) -> float:
        """Where a tenant becoming active in ``group`` now would start."""
        active = self.active.get(group)
        floor = self.floors.get(group, 0.0)
        if not active:
            return floor
        return max(floor, min(self.counter(group, k) for k in active))

    def charge(
        self, group: str, key: TenantKey, seq: Sequence, num_tokens: int, scale=1.0
    ) -> float:
        """Charge ``key`` for ``seq``'s next ``num_tokens`` positions, those
        never charged before, prompt and output at their weights times
        ``scale``; returns the amount charged."""
        amount = self.cost(seq, num_tokens) * scale
        if amount:
            counters = self.counters.setdefault(group, {})
            counters[key] = counters.get(key, self.floors.get(group, 0.0)) + amount
        return amount

    def cost(self, seq: Sequence, num_tokens: int) -> float:
        """Weighted tokens of ``seq``'s next ``num_tokens`` positions not yet
        charged; marks them charged.

        The first prompt chunk charges the whole prompt, as VTC charges it
        at admission: a tenant whose long prompt is still prefilling in
        chunks must not look cheap to the admissions of the next steps.
        """
        start = seq.num_computed_tokens
        prompt_len = seq.num_prompt_tokens
        end = start + num_tokens
        if start < prompt_len:
            end = max(end, prompt_len)
        low = max(seq.num_charged_tokens, start)
        if seq.index:
            # A sibling choice shares the first choice's prompt blocks.
            low = max(low, prompt_len)
        if end <= low:
            return 0.0
        seq.num_charged_tokens = end
        prompt = max(0, min(end, prompt_len) - low)
        output = end - max(low, prompt_len) if end > prompt_len else 0
        return prompt * self.prompt_weight + output * self.output_weight
