"""The timing loop both peers share: TPOT as vLLM defines it, sampling passed through."""

from __future__ import annotations

from bench.peers.common import Driver, Sampling, StepEvent


class ScriptedPeer:
    """A step-driven peer whose steps return a fixed script of tokens.

    ``script[i]`` is what step i returns: {request id: (token count, finished)}.
    """

    def __init__(self, script: list[dict[str, tuple[int, bool]]]) -> None:
        self.script = script
        self.added: list[tuple[str, Sampling]] = []

    def add(self, request_id, prompt, max_tokens, salt, sampling) -> None:
        self.added.append((request_id, sampling))

    def step(self) -> list[StepEvent]:
        events = self.script.pop(0)
        return [
            StepEvent(rid, list(range(count)), finished)
            for rid, (count, finished) in events.items()
        ]


def test_tpot_counts_every_token_of_a_multi_token_step():
    # One request: 1 token, then 4 at once (a verified draft), then 1.
    peer = ScriptedPeer([{"a": (1, False)}, {"a": (4, False)}, {"a": (1, True)}])
    driver = Driver(peer, salt="s", sampling=Sampling(0.8, 0.95))
    driver.submit("a", [1, 2, 3], 6)
    driver.run()
    track = driver.tracks["a"]
    track.token_times = [10.0, 10.1, 10.1, 10.1, 10.1, 10.2]
    track.finished = 10.2
    summary = driver.summary(started=9.9)
    # (10.2 - 10.0) / (6 - 1) = 40 ms, where the ITL p50 reads 0.
    assert summary["tpot"]["p50_ms"] == 40.0
    assert summary["itl"]["p50_ms"] == 0.0
    assert summary["output_tokens"] == 6
    assert summary["requests_short_of_max_tokens"] == 0
    assert peer.added == [("a", Sampling(0.8, 0.95))]


def test_tpot_leaves_out_single_token_requests():
    peer = ScriptedPeer([{"a": (1, True), "b": (1, False)}, {"b": (1, True)}])
    driver = Driver(peer, salt="s")
    driver.submit("a", [1], 1)
    driver.submit("b", [1], 2)
    driver.run()
    summary = driver.summary(started=min(t.submitted for t in driver.tracks.values()))
    assert summary["tpot"]["n"] == 1
    assert summary["ttft"]["n"] == 2
