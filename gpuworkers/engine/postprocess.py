"""A step's sampled tokens -> the choices' text, stop decisions and outputs.

The engine's postprocess, minus what needs the engine's own state (the
scheduler, its counters, its failure list): per token the detokenizer, the
logprobs, the grammar and the stop checks; per request the
``RequestOutput`` the caller sees.
"""

from __future__ import annotations

from gpuworkers.engine.outputs import ChoiceDelta, RequestOutput, TokenLogprob
from gpuworkers.engine.sampling import SampleResult
from gpuworkers.engine.sequence import Request, Sequence

# request id -> choice index -> what this step adds to that choice.
Deltas = dict[str, dict[int, ChoiceDelta]]


def append_token(
    seq: Sequence,
    result: SampleResult,
    now: float,
    deltas: Deltas,
    *,
    later: int,
    tokenizer,
    max_model_len: int,
) -> str | None:
    """Account for a token the scheduler appended to ``seq``, with ``later``
    more of this step's tokens appended after it; returns why the choice
    ends ("stop", "length") or None.

    Sets ``seq.finish_reason``; taking the sequence out of the scheduler is
    the caller's.
    """
    request = seq.request
    params = request.params
    token = result.token_id
    if request.first_token_time is None:
        request.first_token_time = now
    finish = None
    is_stop_token = token in request.stop_ids
    # A stop token's own text (usually none: EOS is special) only on request.
    keep = not is_stop_token or params.include_stop_str_in_output
    text = seq.detokenizer.add(token) if keep else ""
    logprob = None
    if seq.logprobs is not None:
        logprob = token_logprob(tokenizer, token, result)
        seq.logprobs.append(logprob)
    # A complete grammar ends the choice: only EOS could follow.
    grammar_done = seq.grammar is not None and seq.grammar.advance(token)
    if is_stop_token or seq.detokenizer.stopped or grammar_done:
        finish = "stop"
    elif (
        seq.num_output_tokens - later >= params.max_tokens
        or seq.num_tokens - later >= max_model_len
    ):
        finish = "length"
    if finish:
        # Text held back for stop strings is the reply's, unless a stop
        # string ended it (then nothing is held back).
        text += seq.detokenizer.flush()
        seq.finish_reason = finish
    choice = deltas.setdefault(request.request_id, {}).setdefault(
        seq.index, ChoiceDelta(seq.index, [], "", [] if seq.logprobs is not None else None)
    )
    choice.token_ids.append(token)
    choice.text += text
    if logprob is not None:
        choice.logprobs.append(logprob)
    choice.finish_reason = finish
    return finish


def token_logprob(tokenizer, token: int, result: SampleResult) -> TokenLogprob:
    """``token``'s logprob and its top alternatives, with their token strings."""
    decode = tokenizer.convert_ids_to_tokens
    top = [(tid, decode(tid), lp) for tid, lp in (result.top or [])]
    return TokenLogprob(token, decode(token), result.logprob, top)


def request_output(request: Request, choices, finished: bool) -> RequestOutput:
    """What the caller sees of ``request`` after a step: ``choices`` and timings."""
    first = request.seqs[0]
    arrival = request.arrival_time
    return RequestOutput(
        request_id=request.request_id,
        choices=sorted(choices, key=lambda c: c.index),
        finished=finished,
        num_prompt_tokens=len(request.prompt_token_ids),
        num_cached_tokens=first.num_cached_tokens,
        queue_time=(request.first_scheduled_time - arrival)
        if request.first_scheduled_time
        else None,
        first_token_time=(request.first_token_time - arrival) if request.first_token_time else None,
        prompt_logprobs=_take_prompt_logprobs(request),
        num_draft_tokens=sum(s.spec.drafted for s in request.seqs),
        num_accepted_tokens=sum(s.spec.accepted for s in request.seqs),
    )


def aborted_output(request: Request) -> RequestOutput:
    """The last output of an aborted request: an ``abort`` ending per choice."""
    # Held-back text is dropped on abort: it may be half a stop string.
    # Choices not forked yet have not started and report nothing.
    choices = [
        ChoiceDelta(s.index, [], "", None, "abort")
        for s in request.seqs
        if s.finish_reason == "abort" and (s.index == 0 or request.forked)
    ]
    return request_output(request, choices, True)


def _take_prompt_logprobs(request: Request) -> list | None:
    """The prompt logprobs, once, on the output that carries the first token."""
    entries = request.prompt_logprobs
    if entries is None or request.prompt_logprobs_sent or request.first_token_time is None:
        return None
    request.prompt_logprobs_sent = True
    return entries
