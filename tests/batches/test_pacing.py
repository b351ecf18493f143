"""The feeder's in-flight bound follows the fleet: the seats of the ready
workers serving the batch's models, plus half as many queued behind them,
never above the cap."""

from __future__ import annotations

from batches.services.pacing import in_flight_target
from wire.workers import WorkerInfo, WorkerState


def worker(name: str, model: str = "m", seats: int | None = 64, state=WorkerState.READY):
    extra = {} if seats is None else {"max_num_seqs": seats}
    return WorkerInfo(worker_id=name, model=model, state=state, extra=extra)


def test_the_bound_is_the_engines_seats_and_half_as_many_queued():
    assert in_flight_target([worker("a")], ["m"], cap=256) == 96
    # A second worker doubles it; the cap still holds.
    assert in_flight_target([worker("a"), worker("b")], ["m"], cap=256) == 192
    assert in_flight_target([worker("a"), worker("b")], ["m"], cap=100) == 100


def test_only_ready_workers_of_the_batchs_models_count():
    workers = [
        worker("a", seats=8),
        worker("b", model="other", seats=64),
        worker("c", seats=64, state=WorkerState.WARMING),
        worker("d", seats=64, state=WorkerState.DRAINING),
    ]
    assert in_flight_target(workers, ["m"], cap=256) == 12
    assert in_flight_target(workers, ["m", "other"], cap=256) == 108


def test_without_seats_to_count_the_cap_decides():
    assert in_flight_target([], ["m"], cap=8) == 8
    assert in_flight_target([worker("a", seats=None)], ["m"], cap=8) == 8
    assert in_flight_target([worker("a", model="other")], ["m"], cap=8) == 8
