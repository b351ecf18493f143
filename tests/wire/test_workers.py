"""Worker registry records: tolerant of fields a newer worker adds."""

from __future__ import annotations

import json

from wire.workers import WorkerInfo, WorkerState, decode_registry


def _record(**extra) -> dict:
    return WorkerInfo(worker_id="w1", model="m", state=WorkerState.READY).to_dict() | extra


def test_from_dict_drops_fields_it_does_not_know():
    """A record with a field this version lacks still decodes (it was cls(**data))."""
    info = WorkerInfo.from_dict(_record(gpu_temperature_c=71, running=3))
    assert info.worker_id == "w1"
    assert info.state is WorkerState.READY
    assert info.running == 3
    assert not hasattr(info, "gpu_temperature_c")


def test_one_unreadable_record_drops_only_that_worker():
    """Garbage or a record missing its state is skipped; the others still route."""
    records = {
        "w1": json.dumps(_record(new_field={"nested": True})),
        "w2": "{not json",
        "w3": json.dumps({"worker_id": "w3", "model": "m"}),
        "w4": json.dumps(_record(state="exploded")),
    }
    assert [w.worker_id for w in decode_registry(records)] == ["w1"]
