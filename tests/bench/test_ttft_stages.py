"""bench.ttft_stages: a request's TTFT cut into stages from its trace's spans."""

from __future__ import annotations

import pytest

from bench.ttft_stages import CHAIN, STAGES, IncompleteTrace, Span, stages_of, summary

T0 = 1_700_000_000.0


def span(name: str, start: float, end: float, *, kind: str = "SpanKind.INTERNAL", **events):
    return Span(
        name=name,
        trace_id="0xabc",
        parent_id=None if kind.endswith("SERVER") else "0x1",
        kind=kind,
        start=T0 + start,
        end=T0 + end,
        attributes={},
        events={k: T0 + v for k, v in events.items()},
    )


def trace(**moved) -> list[Span]:
    """One request's spans, a millisecond apart in the chain's order."""
    at = {
        "auth": (0.002, 0.004),
        "request.build": (0.004, 0.005),
        "model.lookup": (0.005, 0.006),
        "limits.count": (0.006, 0.007),
        "safety.screen": (0.007, 0.010),
        "prompt.prepare": (0.007, 0.012),
        "limits.admit": (0.012, 0.013),
        "dispatch": (0.013, 0.016),
        "bus.submit": (0.014, 0.016),
        "gpuworker.request": (0.015, 0.300),
        "engine.queued": (0.015, 0.017),
        "engine.prefill": (0.017, 0.100),
        **moved,
    }
    spans = [span(name, *times) for name, times in at.items()]
    spans.append(span("relay", 0.016, 0.3, first_token=0.105))
    spans.append(
        span("POST /v1/chat/completions", 0.001, 0.3, kind="SpanKind.SERVER", first_chunk=0.107)
    )
    return spans


def test_the_stages_follow_the_chain_and_add_up_to_the_clients_ttft():
    stages = stages_of(trace(), sent_at=T0, first_chunk_at=T0 + 0.110)
    assert list(stages) == list(STAGES) == [stage for stage, _, _ in CHAIN] + ["web.write"]
    assert sum(stages.values()) == pytest.approx(110.0)
    assert stages["web.receive"] == pytest.approx(1.0)
    assert stages["auth"] == pytest.approx(3.0)
    # The tokenizer outlasted the screen it ran beside by 2 ms.
    assert stages["safety.screen"] == pytest.approx(3.0)
    assert stages["prompt.prepare"] == pytest.approx(2.0)
    # Dispatch ends where the enqueue starts; the worker's intake follows.
    assert stages["dispatch"] == pytest.approx(1.0)
    assert stages["bus.wait"] == pytest.approx(1.0)
    assert stages["engine.prefill"] == pytest.approx(83.0)
    assert stages["relay.hop"] == pytest.approx(5.0)
    assert stages["sse.frame"] == pytest.approx(2.0)
    assert stages["web.write"] == pytest.approx(3.0)


def test_a_stage_hidden_behind_the_one_before_costs_nothing():
    stages = stages_of(
        trace(**{"prompt.prepare": (0.007, 0.009)}), sent_at=T0, first_chunk_at=T0 + 0.110
    )
    assert stages["prompt.prepare"] == 0
    assert min(stages.values()) >= 0
    assert sum(stages.values()) == pytest.approx(110.0)


@pytest.mark.parametrize("missing", ["auth", "engine.prefill", "relay"])
def test_a_trace_without_a_stage_is_refused(missing):
    spans = [s for s in trace() if s.name != missing]
    with pytest.raises(IncompleteTrace, match=missing):
        stages_of(spans, sent_at=T0, first_chunk_at=T0 + 0.110)


def test_a_span_without_its_event_is_refused():
    spans = [
        span("relay", 0.016, 0.3) if s.name == "relay" else s  # no first_token event
        for s in trace()
    ]
    with pytest.raises(IncompleteTrace, match="first_token"):
        stages_of(spans, sent_at=T0, first_chunk_at=T0 + 0.110)


def test_the_summary_gives_each_stage_its_percentiles():
    rows = [{"auth": float(v)} for v in range(1, 21)]
    figures = summary(rows, ("auth",))["auth"]
    assert figures == {"p50": 10.5, "p95": 19.05, "mean": 10.5}
