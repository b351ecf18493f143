"""A failing step, narrowed down to the requests that make it fail.

When the runner raises on a step's batch, the step is run again on halves
of the batch's requests, each half that still raises halved again, down to
single requests (bisection: about 2 log2(N) extra passes for one culprit
among N, none while steps succeed). What a sub-batch computed is kept: its
rows write the same cache slots with the same inputs, so the good halves
together are the step without the culprits. Cache operations (swaps,
copy-on-write) ran once before the first attempt and never run again: a
swapped-out block may already be reused by this step.

If no sub-batch succeeds, nothing is request-specific (a broken device, a
kernel bug on every shape): the original exception propagates and the
caller fails the whole step. A batch of one request has nothing to compare
with: that request fails alone and the requests queued behind it go on
(a device that fails everything then fails step after step, which the
worker counts as a broken engine: ``LLMEngine.last_step_failed``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from gpuworkers.engine.sampling import SampleResult
from gpuworkers.engine.sampling.results import StepOutput
from gpuworkers.engine.scheduling.batch import CacheOps, ScheduledBatch, ScheduledSeq, assemble
from gpuworkers.engine.sequence import Sequence

Pairs = list[tuple[ScheduledSeq, Sequence]]


@dataclass(slots=True)
class Isolated:
    """The step without its culprits, ready for ``Scheduler.on_step_done``."""

    # The surviving requests' share of the step, as one batch.
    batch: ScheduledBatch
    # One result per ``batch.samples`` entry, in that order.
    sampled: list[SampleResult]
    # Each good sub-batch with its output (for the prompt logprobs).
    parts: list[tuple[ScheduledBatch, StepOutput]] = field(default_factory=list)
    # request id -> what its own sub-batch raised.
    failed: dict[str, Exception] = field(default_factory=dict)


def isolate(
    execute: Callable[[ScheduledBatch], StepOutput],
    seqs: dict[int, Sequence],
    batch: ScheduledBatch,
    error: Exception,
) -> Isolated:
    """Re-run ``batch`` (which raised ``error``) in parts to find its culprits."""
    groups: dict[str, Pairs] = {}
    for item in batch.seqs:
        seq = seqs[item.seq_id]
        groups.setdefault(seq.request.request_id, []).append((item, seq))
    requests = list(groups.items())
    parts: list[tuple[ScheduledBatch, StepOutput]] = []
    failed: dict[str, Exception] = {}

    def run(part: list[tuple[str, Pairs]]) -> None:
        sub = assemble([pair for _, pairs in part for pair in pairs], CacheOps())
        try:
            parts.append((sub, execute(sub)))
        except Exception as exc:
            if len(part) == 1:
                failed[part[0][0]] = exc
                return
            half = len(part) // 2
            run(part[:half])
            run(part[half:])

    if len(requests) > 1:
        # The whole batch is known to fail: start from its halves.
        half = len(requests) // 2
        run(requests[:half])
        run(requests[half:])
        if not parts:
            raise error
    else:
        ((request_id, _),) = requests
        failed[request_id] = error
    good = [pair for request_id, pairs in requests if request_id not in failed for pair in pairs]
    merged = assemble(good, CacheOps())
    # A verifying sequence has one sample per verified position: the key is
    # the sequence and the position.
    by_sample = {
        (sample.seq_id, sample.spec_index): result
        for sub, out in parts
        for sample, result in zip(sub.samples, out.sampled, strict=True)
    }
    sampled = [by_sample[sample.seq_id, sample.spec_index] for sample in merged.samples]
    return Isolated(merged, sampled, parts, failed)
