"""The fair order's estimate for admission control (scheduling/
fair_estimate.py): what is ahead of a tenant's next request, checked
against the order the scheduler then actually follows. No model."""

from __future__ import annotations

from gpuworkers.engine.sequence import SequenceStatus
from tests.gpuworkers.engine.fair_helpers import Flood, add, make, step


def test_the_estimate_is_the_order_the_scheduler_follows():
    """One slot, prompts only (max_tokens=1: no decode is ever charged), so
    counters move only by the prompts the estimate counts: the requests it
    puts ahead of a new request of tenant b are exactly those that start
    before it, whatever b's class."""
    for service_class in ("priority", "default", "flex"):
        scheduler, kv = make(max_num_seqs=1)
        queued = [
            add(scheduler, "pro", tenant, length, 1, service_class=cls)
            for tenant, length, cls in (
                ("a", 30, "default"),
                ("a", 50, "default"),
                ("a", 21, "default"),
                ("b", 41, "flex"),
                ("b", 43, "default"),
                ("c", 103, "default"),
                ("c", 17, "default"),
            )
        ]
        step(scheduler, kv)
        step(scheduler, kv)
        waiting = [s for s in queued if s.status is SequenceStatus.WAITING]
        estimate = scheduler.fair_queue()["pro"]["tenants"]["b"][service_class]
        new = add(scheduler, "pro", "b", 7, 1, service_class=service_class)
        while new.status is SequenceStatus.WAITING:
            step(scheduler, kv)
        before = [s for s in waiting if s.status is not SequenceStatus.WAITING]
        assert estimate == {
            "requests": len(before),
            "tokens": sum(s.num_prompt_tokens for s in before),
        }, service_class
        assert len(before) >= (1 if service_class == "priority" else 2)


def test_a_flooding_tenant_has_its_own_queue_ahead_a_light_one_little_a_new_one_nothing():
    scheduler, kv = make(max_num_seqs=64, max_num_batched_tokens=512)
    flood = Flood(scheduler, "pro", [f"f{i}" for i in range(4)], 16, 1300, 64)
    for now in range(30):
        flood.top_up(float(now))
        step(scheduler, kv)
    add(scheduler, "pro", "light", 24, 8)
    tier = scheduler.fair_queue()["pro"]
    assert tier["active_tenants"] == 5
    flooder = tier["tenants"]["f0"]["default"]
    light = tier["tenants"]["light"]["default"]
    own = sum(s.request.tenant == "f0" for s in scheduler.waiting)
    assert flooder["requests"] >= own > 10
    assert light["requests"] <= 1 + 4, "its own request and at most one per flooder"
    assert "newcomer" not in tier["tenants"], "a tenant with no work starts at the floor"
    levels = [tier["tenants"][f"f{i}"]["level"] for i in range(4)]
    assert all(level > 0 for level in levels) and tier["tenants"]["light"]["level"] == 0
    assert all(tier["tenants"][f"f{i}"]["running"] >= 0 for i in range(4))


def test_batch_work_is_not_in_the_interactive_order():
    scheduler, _ = make(max_num_seqs=1)
    add(scheduler, "pro", "a", 16, 4, service_class="batch")
    add(scheduler, "pro", "b", 16, 4)
    tenants = scheduler.fair_queue()["pro"]["tenants"]
    assert set(tenants) == {"b"}
    assert tenants["b"]["default"] == {"requests": 1, "tokens": 16}
