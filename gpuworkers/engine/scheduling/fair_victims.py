"""Whom FairPolicy preempts: batch first, then by tier share, then by tenant.

Whether a preemption serves fairness is a question about what each party
holds *now* (running slots and KV, over its share), not about counters:
counters measure service over time, and a tenant becoming active is lifted
to the least-served one's, so backlogged tenants' counters are close by
construction. Counters decide *whom* among the eligible: the most-served
tenant gives back first. A sequence under its progress guarantee
(``Sequence.preempt_guard``) is never a claim's victim.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from typing import TYPE_CHECKING

from gpuworkers.engine.scheduling.capacity import seats
from gpuworkers.engine.scheduling.policy import priority_key
from gpuworkers.engine.scheduling.tenant_counters import BATCH_GROUP, TenantKey
from gpuworkers.engine.sequence import Sequence

if TYPE_CHECKING:
    from gpuworkers.engine.scheduling.fair_policy import FairPolicy


def victim_rank(seq: Sequence):
    """Larger goes first among otherwise equal victims: the lower class,
    then the lower priority, then the newest."""
    return (seq.request.service_class.rank, *priority_key(seq))


def batch_victim(policy: FairPolicy, running: Iterable[Sequence]) -> Sequence | None:
    """The running batch sequence past its guarantee of the batch tenant
    most served, newest first; None if there is none."""
    counters = policy.batch_counters
    best, best_key = None, None
    for seq in running:
        if not seq.request.is_batch or seq.preempt_guard:
            continue
        key = (counters.counter(BATCH_GROUP, policy.key_of(seq)), victim_rank(seq))
        if best_key is None or key > best_key:
            best, best_key = seq, key
    return best


def most_over_share(
    policy: FairPolicy,
    candidates: Iterable[Sequence],
    running: list[Sequence],
    claim: Sequence | None = None,
) -> Sequence | None:
    """Of the tier most over its share, the most-served tenant's newest,
    lowest-priority candidate (interactive ``running`` gives the usage).

    For a ``claim`` a sequence is taken only if its tier stays above the
    claimant's, both relative to their shares, once the claim runs: a tier
    is never pushed below the one that claimed from it.
    """
    share, footprint = policy.share, policy.footprint
    slots, blocks = share.tally(running, footprint)
    claimant = share.tier_of(claim) if claim is not None else None
    claim_level = 0.0
    if claim is not None:
        claim_level = share.level(
            claimant, slots[claimant] + seats(claim), blocks[claimant] + footprint(claim)
        )
    best, best_key = None, None
    for seq in candidates:
        tier = share.tier_of(seq)
        level = share.level(tier, slots[tier], blocks[tier])
        if tier == claimant or level <= 1.0:
            continue
        if claim is not None:
            after = share.level(tier, slots[tier] - seats(seq), blocks[tier] - footprint(seq))
            if after <= claim_level:
                continue
        counter = policy.counters.counter(tier, policy.key_of(seq))
        key = (level, counter, victim_rank(seq))
        if best_key is None or key > best_key:
            best, best_key = seq, key
    return best


def tenant_tally(policy: FairPolicy, running: Iterable[Sequence]):
    """(slots, blocks) per tenant of (interactive) ``running``, two Counters."""
    slots: Counter[TenantKey] = Counter()
    blocks: Counter[TenantKey] = Counter()
    for seq in running:
        key = policy.key_of(seq)
        slots[key] += seats(seq)
        blocks[key] += policy.footprint(seq)
    return slots, blocks


def tenant_level(policy: FairPolicy, tier: str, slots: int, blocks: int) -> float:
    """A tenant's dominant usage over its share: its tier's share split
    evenly between the tier's active tenants (1.0: exactly its share)."""
    return policy.share.level(tier, slots, blocks) * policy.num_tenants.get(tier, 1)


def tenant_may_claim(policy: FairPolicy, head: Sequence) -> bool:
    """Whether ``head``'s tenant shares its tier and is under its share there."""
    key = policy.key_of(head)
    if policy.num_tenants.get(key[0], 1) < 2:
        return False
    return policy.tenant_usage.get(key, 0.0) * policy.num_tenants[key[0]] < policy.share.share_of(
        key[0]
    )


def tenant_victim(policy: FairPolicy, claim: Sequence) -> Sequence | None:
    """A sequence of the claimant's tier whose tenant is over its share,
    above the claimant's tenant by more than the margin (both over their
    shares) once the claim runs, and served more than the counter slack
    beyond it; of those tenants, the most served. None unless the
    claimant's tenant is under its share of the tier.

    Unlike between tiers, the victim's tenant may end below the claimant:
    a tenant often holds one or two long sequences, and "stays above"
    would then forbid taking its only one for a short request. The rule is
    still antisymmetric (the victim could claim back only if the claimant
    were above it by the margin, which it is not), so nothing moves back
    and forth, and the progress guarantee bounds longer cycles."""
    tier, _ = claimant = policy.key_of(claim)
    if policy.num_tenants.get(tier, 1) < 2:
        return None
    running = [s for s in policy.interactive(policy.queues.running) if policy.key_of(s)[0] == tier]
    slots, blocks = tenant_tally(policy, running)
    if tenant_level(policy, tier, slots[claimant], blocks[claimant]) >= 1.0:
        return None
    footprint = policy.footprint
    claim_counter = policy.counters.counter(tier, claimant)
    claim_after = tenant_level(
        policy, tier, slots[claimant] + seats(claim), blocks[claimant] + footprint(claim)
    )
    best, best_key = None, None
    for seq in running:
        key = policy.key_of(seq)
        if key == claimant or seq.preempt_guard:
            continue
        level = tenant_level(policy, tier, slots[key], blocks[key])
        if level <= 1.0 or level <= claim_after + policy.margin:
            continue
        counter = policy.counters.counter(tier, key)
        if counter <= claim_counter + policy.slack:
            # Counters that close converge by admission order alone: a
            # preemption here would only trade one swap for another.
            continue
        rank = (counter, victim_rank(seq))
        if best_key is None or rank > best_key:
            best, best_key = seq, rank
    return best
