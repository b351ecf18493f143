"""A request whose own processing raises fails alone; the others' steps go on.

Real engine (float32 demo model). Faults are injected on the engine object:
a wrapper around the runner's ``execute`` that raises whenever a batch holds
the doomed request's sequence (its rows make the forward pass or sampler
fail), or a detokenizer that raises on the doomed request's tokens. All
requests run deterministic (batch-invariant) greedy decoding, so the
survivors' tokens can be compared with a run without the doomed request
even though isolation re-runs their rows in smaller batches.
"""

from __future__ import annotations

import pytest

from gpuworkers.engine import SamplingParams


def _params(max_tokens: int = 10) -> SamplingParams:
    return SamplingParams(
        max_tokens=max_tokens, temperature=0.0, ignore_eos=True, deterministic=True
    )


def _run(engine, prompts: dict[str, list[int]], *, arm=None) -> dict[str, list[int]]:
    """Serve ``prompts`` to the end; token ids per request id (None: failed)."""
    for request_id, prompt in prompts.items():
        engine.add_request(request_id, prompt, _params())
    tokens: dict[str, list[int]] = {rid: [] for rid in prompts}
    steps = 0
    while engine.has_unfinished_requests():
        if arm is not None and steps == 3:
            arm()  # the doomed request has decoded a few tokens by now
        for output in engine.step():
            if tokens[output.request_id] is None:
                # A failed request's last output: its abort, no tokens.
                assert all(c.finish_reason == "abort" and not c.token_ids for c in output.choices)
                continue
            for choice in output.choices:
                tokens[output.request_id] += choice.token_ids
        for request_id, _ in engine.take_failures():
            tokens[request_id] = None
        steps += 1
    return tokens


@pytest.mark.parametrize("fault", ["forward", "detokenizer"])
def test_a_failing_request_fails_alone_and_the_others_keep_their_tokens(
    make_engine, chat_prompts, fault
):
    engine = make_engine()
    prompts = {"a": chat_prompts[0], "b": chat_prompts[1], "c": chat_prompts[2]}
    reference = _run(engine, {k: v for k, v in prompts.items() if k != "doomed"})
    prompts["doomed"] = chat_prompts[3]
    real_execute = engine.runner.execute

    def arm() -> None:
        request = engine.requests["doomed"]
        if fault == "forward":
            doomed = {seq.seq_id for seq in request.seqs}

            def execute(batch):
                if any(item.seq_id in doomed for item in batch.seqs):
                    raise RuntimeError("this request's rows break the step")
                return real_execute(batch)

            engine.runner.execute = execute
        else:
            seq = request.seqs[0]
            real = seq.detokenizer

            class Broken:
                def add(self, token):
                    raise UnicodeDecodeError("utf-8", b"\xff", 0, 1, "bad token bytes")

                def __getattr__(self, name):
                    return getattr(real, name)

            seq.detokenizer = Broken()

    got = _run(engine, prompts, arm=arm)
    engine.runner.execute = real_execute
    assert got["doomed"] is None
    assert {k: got[k] for k in reference} == reference
    assert all(len(v) == 10 for v in reference.values())
    # The doomed request's blocks went back with it; nothing is left running.
    assert engine.stats()["kv_blocks_used"] == 0
    assert engine.stats()["running"] == 0 and not engine.requests


def test_a_step_that_fails_for_every_request_raises(make_engine, chat_prompts):
    """Nothing request-specific (every part fails): the step's error propagates."""
    engine = make_engine()
    engine.add_request("a", chat_prompts[0], _params())
    engine.add_request("b", chat_prompts[1], _params())
    engine.step()

    def broken(batch):
        raise RuntimeError("device lost")

    engine.runner.execute = broken
    with pytest.raises(RuntimeError, match="device lost"):
        engine.step()
    assert engine.take_failures() == []


def test_a_failing_batch_of_one_fails_that_request_only(make_engine, chat_prompts):
    """One request per step (max_num_seqs=1): when its batch raises there is
    nothing to bisect, yet it is that request's failure, not the engine's.
    It fails alone with its blocks freed; the request queued behind it is
    served in full. A step whose batch succeeds clears last_step_failed."""
    engine = make_engine(max_num_seqs=1)
    reference = _run(engine, {"b": chat_prompts[1]})
    prompts = {"doomed": chat_prompts[0], "b": chat_prompts[1]}
    real_execute = engine.runner.execute
    seen_failed_step = []

    def arm() -> None:
        doomed = {seq.seq_id for seq in engine.requests["doomed"].seqs}

        def execute(batch):
            if any(item.seq_id in doomed for item in batch.seqs):
                raise RuntimeError("this request's rows break the step")
            return real_execute(batch)

        engine.runner.execute = execute
        real_step = engine.step

        def step():
            outputs = real_step()
            seen_failed_step.append(engine.last_step_failed)
            return outputs

        engine.step = step

    got = _run(engine, prompts, arm=arm)
    engine.runner.execute = real_execute
    del engine.step
    assert got == {"doomed": None, "b": reference["b"]}
    assert seen_failed_step[0] is True and not any(seen_failed_step[1:])
    assert engine.stats()["kv_blocks_used"] == 0
    assert engine.stats()["running"] == 0 and not engine.requests
