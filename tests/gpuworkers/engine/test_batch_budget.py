"""The batch class's budget under the fair policy: an interactive arrival's
prefill runs in the very next step, without batch work; while interactive
work is about, batch computes at most ``batch_step_tokens`` per step; with
none about for ``batch_yield_seconds`` it takes the whole step. Tiny pools,
no model; the policy's clock is a fake one."""

from __future__ import annotations

from gpuworkers.engine.scheduling.fair_policy import BATCH_DEFER_MAX_STEPS
from gpuworkers.engine.sequence import SequenceStatus
from tests.gpuworkers.engine.fair_helpers import add, drain, make, step


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def make_clocked(**options):
    scheduler, kv = make(**options)
    clock = Clock()
    scheduler.policy.clock = clock
    return scheduler, kv, clock


def planned(scheduler) -> tuple[dict[int, int], object]:
    """The next step's tokens per sequence id (and the step, to finish)."""
    out = scheduler.schedule()
    return {item.seq_id: item.num_new_tokens for item in out.seqs}, out


def finish(scheduler, kv, out) -> None:
    for seq, _ in scheduler.on_step_done(out, [7] * len(out.samples)):
        if seq.num_output_tokens >= seq.request.params.max_tokens:
            scheduler.remove(seq)
            seq.status = SequenceStatus.FINISHED
    kv.allocator.check_invariants()


def test_an_interactive_arrival_prefills_in_the_next_step_without_batch_work():
    """Batch lines fill every seat and decode; an interactive request
    arrives: the very next step is its whole prompt and nothing of the
    batch (one batch line gave up its seat), and after it batch decodes
    come back within batch_step_tokens."""
    scheduler, kv, _ = make_clocked(max_num_seqs=8, batch_step_tokens=4)
    batch = [add(scheduler, "pro", "b", 16, 200, service_class="batch") for _ in range(8)]
    for _ in range(3):
        step(scheduler, kv)
    assert all(s.status is SequenceStatus.RUNNING and not s.is_prefilling for s in batch)
    tokens, out = planned(scheduler)
    assert sorted(tokens.values()) == [1] * 8, "alone, every batch line decodes"
    finish(scheduler, kv, out)
    interactive = add(scheduler, "free", "i", 40, 8)
    tokens, out = planned(scheduler)
    assert tokens == {interactive.seq_id: 40}
    assert sum(s.status is SequenceStatus.RUNNING for s in batch) == 7
    finish(scheduler, kv, out)
    assert interactive.num_output_tokens == 1
    tokens, out = planned(scheduler)
    assert tokens[interactive.seq_id] == 1
    assert sum(tokens[s.seq_id] for s in batch if s.seq_id in tokens) == 4
    finish(scheduler, kv, out)
    drain(scheduler, kv)
    assert all(s.num_output_tokens == 200 for s in batch)


def test_batch_takes_the_whole_step_once_interactive_work_is_gone_a_while():
    scheduler, kv, clock = make_clocked(
        max_num_seqs=8, batch_step_tokens=3, batch_yield_seconds=5.0
    )
    for _ in range(6):
        add(scheduler, "pro", "b", 16, 400, service_class="batch")
    interactive = add(scheduler, "free", "i", 16, 4)
    while not interactive.is_finished:
        step(scheduler, kv)
    clock.now += 4.0
    for _ in range(3):
        tokens, out = planned(scheduler)
        assert sum(tokens.values()) == 3, "interactive work was about 4 s ago"
        finish(scheduler, kv, out)
    clock.now += 1.5
    tokens, out = planned(scheduler)
    assert sum(tokens.values()) > 3
    finish(scheduler, kv, out)
    # Running batch lines all decode now; the ones still waiting start.
    for _ in range(10):
        step(scheduler, kv)
    tokens, out = planned(scheduler)
    assert sorted(tokens.values()) == [1] * 6
    finish(scheduler, kv, out)
    drain(scheduler, kv)


def test_a_long_interactive_prefill_defers_batch_for_a_bounded_number_of_steps():
    """A prompt that takes many chunks keeps batch out of its steps, but
    batch still gets one step after BATCH_DEFER_MAX_STEPS in a row."""
    scheduler, kv, _ = make_clocked(
        num_blocks=400, max_num_seqs=4, max_num_batched_tokens=64, batch_step_tokens=8
    )
    batch = [add(scheduler, "pro", "b", 16, 400, service_class="batch") for _ in range(2)]
    for _ in range(3):
        step(scheduler, kv)
    long = add(scheduler, "free", "i", 64 * 30, 2)
    batch_steps = []
    for index in range(2 * (BATCH_DEFER_MAX_STEPS + 1)):
        tokens, out = planned(scheduler)
        assert long.is_prefilling
        if any(s.seq_id in tokens for s in batch):
            batch_steps.append(index)
            assert long.seq_id not in tokens or tokens[long.seq_id] <= 64 - 2
        finish(scheduler, kv, out)
    assert batch_steps == [BATCH_DEFER_MAX_STEPS, 2 * BATCH_DEFER_MAX_STEPS + 1]
    drain(scheduler, kv)
