"""Virtual token counters (scheduling/tenant_counters.py) on their own:
charging, the lift of newcomers, forgetting. No model, no scheduler."""

from __future__ import annotations

import itertools

from gpuworkers.engine.sampling_params import SamplingParams
from gpuworkers.engine.scheduling.tenant_counters import TenantCounters
from gpuworkers.engine.sequence import Request, Sequence

_ids = itertools.count()
A, B, C = ("pro", "a"), ("pro", "b"), ("pro", "c")


def seq(prompt_len=10, index=0):
    request = Request(f"r{next(_ids)}", list(range(prompt_len)), SamplingParams(max_tokens=50))
    s = Sequence(next(_ids), request, index, list(range(prompt_len)), prompt_len)
    request.seqs.append(s)
    return s


def test_the_first_prompt_chunk_charges_the_whole_prompt_outputs_at_their_weight():
    counters = TenantCounters(prompt_weight=1.0, output_weight=2.0)
    s = seq(prompt_len=10)
    assert counters.charge("pro", A, s, 4) == 10.0, "whole prompt at the first chunk"
    s.num_computed_tokens = 4
    assert counters.charge("pro", A, s, 6) == 0.0, "the prompt's later chunks are paid"
    s.num_computed_tokens = 10
    s.token_ids.append(7)  # first output sampled; its position is computed next
    assert counters.charge("pro", A, s, 1) == 2.0
    assert counters.counter("pro", A) == 12.0


def test_recompute_after_preemption_and_prefix_hits_are_not_charged():
    counters = TenantCounters(prompt_weight=1.0, output_weight=2.0)
    s = seq(prompt_len=8)
    s.num_computed_tokens = 4  # 4 tokens came from the prefix cache
    assert counters.charge("pro", A, s, 4) == 4.0
    s.num_computed_tokens = 8
    s.token_ids += [7, 7, 7]
    for _ in range(3):
        counters.charge("pro", A, s, 1)
        s.num_computed_tokens += 1
    assert counters.counter("pro", A) == 4.0 + 3 * 2.0
    # Preempted to recompute: prompt + outputs are prefilled again.
    s.num_computed_tokens = 0
    assert counters.charge("pro", A, s, 11) == 0.0
    assert counters.counter("pro", A) == 10.0


def test_a_sibling_choice_pays_only_for_its_own_outputs():
    counters = TenantCounters(prompt_weight=1.0, output_weight=2.0)
    child = seq(prompt_len=6, index=1)
    child.num_computed_tokens = 6  # forked off the prompt's blocks
    child.token_ids.append(7)
    assert counters.charge("pro", A, child, 1) == 2.0


def test_weights_and_scale_apply():
    counters = TenantCounters(prompt_weight=0.5, output_weight=3.0)
    s = seq(prompt_len=10)
    assert counters.charge("batch", A, s, 10, scale=2.0) == 10.0


def test_a_newcomer_is_lifted_to_the_least_served_active_tenant():
    counters = TenantCounters(1.0, 2.0)
    counters.observe({"pro": {A, B}})
    counters.counters["pro"].update({A: 500.0, B: 300.0})
    counters.observe({"pro": {A, B, C}})
    assert counters.counter("pro", C) == 300.0, "not 0: idle time banks no credit"
    assert counters.floor("pro") == 300.0


def test_a_departed_tenant_keeps_its_debt_and_is_forgotten_once_the_floor_passes():
    counters = TenantCounters(1.0, 2.0)
    counters.observe({"pro": {A, B}})
    counters.counters["pro"].update({A: 900.0, B: 100.0})
    counters.observe({"pro": {B}})  # A leaves, served far more than B
    counters.observe({"pro": {A, B}})  # and comes back
    assert counters.counter("pro", A) == 900.0, "pausing does not reset a debt"
    counters.observe({"pro": {B}})
    counters.counters["pro"][B] = 1000.0
    counters.observe({"pro": {B}})  # the floor passes A's counter
    assert A not in counters.counters["pro"], "at or under the floor: nothing to remember"
    assert counters.floor("pro") == 1000.0


def test_an_idle_group_forgets_everyone_and_starts_them_level():
    counters = TenantCounters(1.0, 2.0)
    counters.observe({"pro": {A, B}})
    counters.counters["pro"].update({A: 50.0, B: 700.0})
    counters.observe({})
    assert counters.counters["pro"] == {}
    counters.observe({"pro": {A, B}})
    assert counters.counter("pro", A) == counters.counter("pro", B) == 700.0


def test_groups_are_independent():
    counters = TenantCounters(1.0, 2.0)
    counters.observe({"pro": {A}, "free": {("free", "x")}})
    counters.counters["pro"][A] = 400.0
    counters.observe({"pro": {A}, "free": {("free", "x"), ("free", "y")}})
    assert counters.counter("free", ("free", "y")) == 0.0
