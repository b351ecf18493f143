"""Celery task metrics from the task signals: runs by final state, durations."""

import pytest

from config.celery_app import app
from config.celery_metrics import DURATION, TASKS


@app.task(name="tests.config.succeeds")
def succeeds() -> int:
    return 1


@app.task(name="tests.config.fails")
def fails() -> None:
    raise RuntimeError("boom")


def _count(task: str, state: str) -> float:
    return TASKS.labels(task, state)._value.get()


def _durations(task: str) -> float:
    (count,) = [
        s.value
        for metric in DURATION.collect()
        for s in metric.samples
        if s.name.endswith("_count") and s.labels["task"] == task
    ]
    return count


def test_runs_failures_and_durations_are_counted_per_task():
    before = (_count(succeeds.name, "success"), _count(fails.name, "failure"))
    assert succeeds.apply().get() == 1
    assert succeeds.apply().get() == 1
    with pytest.raises(RuntimeError):
        fails.apply().get()
    assert _count(succeeds.name, "success") - before[0] == 2
    assert _count(fails.name, "failure") - before[1] == 1
    assert _count(succeeds.name, "failure") == 0
    assert _durations(succeeds.name) >= 2 and _durations(fails.name) >= 1
