"""Service classes under the fair policy (priority > default > flex within
a tenant; batch below every interactive request), and that FCFS and
Priority ignore tenants and classes. Tiny pools, no model, except the last
test, which goes through ``LLMEngine.add_request`` with the demo model."""

from __future__ import annotations

import pytest

from gpuworkers.engine import SamplingParams
from gpuworkers.engine.sequence import SequenceStatus
from tests.gpuworkers.engine.fair_helpers import add, drain, make, step


def started_order(scheduler, kv, seqs, limit=500):
    """The sequences of ``seqs`` in the order they first ran."""
    order = []
    for _ in range(limit):
        step(scheduler, kv)
        order += [s for s in scheduler.running if s in seqs and s not in order]
        order += [s for s in seqs if s.is_finished and s not in order]
        if len(order) == len(seqs):
            return order
    raise AssertionError("not all started")


def test_a_tenants_own_requests_go_priority_then_default_then_flex():
    scheduler, kv = make(max_num_seqs=1)
    flex = add(scheduler, "pro", "a", service_class="flex", at=1.0)
    default = add(scheduler, "pro", "a", service_class="default", at=2.0)
    priority = add(scheduler, "pro", "a", service_class="priority", at=3.0)
    assert started_order(scheduler, kv, [flex, default, priority]) == [priority, default, flex]


def test_between_tenants_the_counter_decides_not_the_class():
    """Tenant a was served first; b's flex request then goes before a's
    priority one: classes order a tenant's own requests only."""
    scheduler, kv = make(max_num_seqs=1)
    first = add(scheduler, "pro", "a", 64, 4)
    step(scheduler, kv)
    a_priority = add(scheduler, "pro", "a", service_class="priority", at=1.0)
    b_flex = add(scheduler, "pro", "b", service_class="flex", at=2.0)
    order = started_order(scheduler, kv, [first, a_priority, b_flex])
    assert order == [first, b_flex, a_priority]


def test_batch_starts_only_when_no_interactive_request_is_queued():
    scheduler, kv = make(num_blocks=64, max_num_seqs=4, batch_step_tokens=0)
    batch = [add(scheduler, "enterprise", "b", 16, 8, service_class="batch") for _ in range(4)]
    interactive = [add(scheduler, "free", "i", 16, 8, at=1.0) for _ in range(6)]
    steps = 0
    while any(s.status is SequenceStatus.WAITING for s in interactive):
        assert all(s.status is SequenceStatus.WAITING for s in batch)
        step(scheduler, kv)
        steps += 1
    assert steps > 1
    drain(scheduler, kv)
    assert all(s.num_output_tokens == 8 for s in batch + interactive)


def test_batch_takes_only_the_budget_interactive_prefill_leaves():
    """A batch prompt prefilling beside an interactive one: while the
    interactive prompt prefills the batch one gets nothing (not even the
    budget its last chunk leaves: that step's time is the first token's),
    then it gets what the interactive decode leaves."""
    scheduler, kv = make(num_blocks=256, max_num_batched_tokens=64, batch_step_tokens=0)
    batch = add(scheduler, "pro", "b", 400, 4, service_class="batch")
    step(scheduler, kv)  # alone: it starts with the whole budget
    interactive = add(scheduler, "free", "i", 200, 4)
    chunks = []
    while interactive.num_output_tokens == 0:
        out = scheduler.schedule()
        tokens = {item.seq_id: item.num_new_tokens for item in out.seqs}
        chunks.append((tokens.get(interactive.seq_id, 0), tokens.get(batch.seq_id, 0)))
        scheduler.on_step_done(out, [7] * len(out.samples))
    assert chunks == [(64, 0)] * 3 + [(8, 0)]
    out = scheduler.schedule()
    tokens = {item.seq_id: item.num_new_tokens for item in out.seqs}
    assert (tokens[interactive.seq_id], tokens[batch.seq_id]) == (1, 63)
    scheduler.on_step_done(out, [7] * len(out.samples))
    drain(scheduler, kv)


def test_batch_is_preempted_first_even_from_a_higher_tier():
    """Enterprise batch work and an over-share free tier fill the slots; a
    pro request's claim swaps out batch, not the free tier's sequence."""
    scheduler, kv = make(num_blocks=128, max_num_seqs=4, batch_step_tokens=0)
    free = [add(scheduler, "free", "f", 16, 40) for _ in range(2)]
    step(scheduler, kv)
    batch = [add(scheduler, "enterprise", "b", 16, 40, service_class="batch") for _ in range(2)]
    step(scheduler, kv)
    assert all(s.status is SequenceStatus.RUNNING for s in free + batch)
    pro = add(scheduler, "pro", "p", 16, 4)
    step(scheduler, kv)
    assert pro.status is SequenceStatus.RUNNING
    assert [s.status for s in batch].count(SequenceStatus.SWAPPED) == 1
    assert all(s.status is SequenceStatus.RUNNING for s in free)
    drain(scheduler, kv)


def test_batch_is_the_first_victim_when_running_sequences_outgrow_the_pool():
    # Three sequences of 56 tokens need 12 blocks of 16 at their longest.
    scheduler, kv = make(num_blocks=10, max_num_seqs=4, admission_policy="optimistic")
    batch = add(scheduler, "enterprise", "b", 16, 40, service_class="batch")
    step(scheduler, kv)
    interactive = [add(scheduler, "free", "f", 16, 40) for _ in range(2)]
    swapped = set()
    while scheduler.has_unfinished():
        step(scheduler, kv)
        swapped |= {s.request.service_class.value for s in scheduler.swapped}
        if interactive[0].is_finished:
            break
    assert swapped == {"batch"}
    assert all(s.num_output_tokens == 40 for s in interactive)
    drain(scheduler, kv)
    assert batch.num_output_tokens == 40


@pytest.mark.parametrize("policy", ["fcfs", "priority"])
def test_fcfs_and_priority_ignore_tenants_and_classes(policy):
    """Arrival order (priority: by priority, then arrival) whatever the
    tenant or class: the orders callers knew before tenants existed."""
    scheduler, kv = make(max_num_seqs=1, policy=policy)
    seqs = [
        add(scheduler, "pro", "a", service_class="batch", at=1.0),
        add(scheduler, "pro", "a", service_class="priority", at=2.0),
        add(scheduler, "pro", "b", service_class="flex", at=3.0),
        add(scheduler, "pro", "c", at=4.0),
    ]
    assert started_order(scheduler, kv, seqs) == seqs


def test_engine_takes_tenant_and_class_and_publishes_the_fair_queue(make_engine):
    engine = make_engine(scheduling_policy="fair", max_num_seqs=1)
    params = SamplingParams(max_tokens=2, temperature=0.0)
    with pytest.raises(ValueError, match="unknown service_class 'gold'"):
        engine.add_request("bad", [1, 2, 3], params, tier="pro", service_class="gold")
    for i in range(3):
        engine.add_request(f"a{i}", [10 + i] * 20, params, tier="pro", tenant="7")
    engine.add_request("b0", [50] * 8, params, tier="pro", tenant="8", service_class="flex")
    engine.add_request("x0", [60] * 8, params, tier="pro", tenant="9", service_class="batch")
    stats = engine.stats()
    assert stats["queued_by_tier"] == {"pro": {"requests": 4, "tokens": 68}}
    assert stats["queued_by_class"]["pro"]["batch"] == {"requests": 1, "tokens": 8}
    tenants = stats["fair_queue"]["pro"]["tenants"]
    assert set(tenants) == {"7", "8"}, "batch work is not in the interactive order"
    # Both tenants start at the floor. Tenant 7's next default request
    # comes after its own three (60 tokens) and tenant 8's (8 tokens keep
    # 8's counter below 60); 8's next flex one after its own and one of 7's.
    assert tenants["7"]["default"] == {"requests": 4, "tokens": 68}
    assert tenants["8"]["flex"] == {"requests": 2, "tokens": 28}
    while engine.has_unfinished_requests():
        engine.step()
    assert engine.stats()["fair_queue"] == {}
    assert engine.kv.allocator.num_used == 0
