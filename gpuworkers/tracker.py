"""Per-response bookkeeping: engine outputs in, stream events out.

The tracker numbers each response's events (``created`` is seq 1), counts
tokens for usage, times the response and queues events until the loop
flushes them in one bus round trip. A response leaves the tracker with its
terminal event, so it can never get a second one from this worker.

It is also where a response's timings are known, so it feeds the worker's
metrics (``gpuworkers.metrics``: TTFT, inter-token latency, e2e, queue,
prefill, decode and inference time, token counts) and spans
(``gpuworkers.spans``) as it builds the events.

And it reports what each billed response used: at the terminal event it
queues a ``wire.usage`` entry, appended to the usage stream when the loop
takes the batch, before the events go out, so the usage is durable
whether or not the web process that asked is still there to record it.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from gpuworkers.metrics import RequestPhases, WorkerMetrics
from gpuworkers.spans import request_span_end, request_span_start
from wire.events import (
    ChoiceDelta,
    Created,
    Delta,
    ErrorInfo,
    Event,
    EventType,
    PromptLogprob,
    PromptLogprobs,
    Terminal,
    Timings,
    TokenLogprob,
    TokenUsage,
    TopLogprob,
)
from wire.requests import GenerationRequest
from wire.usage import UsageEntry, UsageStream, get_usage_stream, usage_entry

logger = logging.getLogger(__name__)

# Engine finish reasons a client sees on a choice; "abort" ends the response
# as ``cancelled`` instead.
CLIENT_FINISH_REASONS = frozenset({"stop", "length"})
# Usage entries kept for the next flush while the stream is unreachable;
# past this many the oldest are dropped (logged), as their events are.
MAX_UNSENT_USAGE = 10_000


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(max(seconds, 0.0) * 1000, 3)


@lru_cache(maxsize=1)
def _byte_decoder() -> dict[str, int]:
    """GPT-2's byte-level alphabet reversed: vocabulary character -> byte."""
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    chars = list(printable)
    extra = 0
    for byte in range(256):
        if byte not in printable:
            printable.append(byte)
            chars.append(256 + extra)
            extra += 1
    return {chr(c): b for b, c in zip(printable, chars, strict=True)}


class TokenBytes:
    """The raw bytes behind a vocabulary token, for logprob ``bytes`` fields.

    Byte-level BPE vocabularies (GPT-2, Llama 3, SmolLM) spell bytes with a
    printable alphabet ("Ġ" is a space, "Ã©" is the two bytes of "é");
    SentencePiece ones use "▁" for a space and "<0xNN>" for raw bytes.
    """

    def __init__(self, tokenizer: Any | None):
        self.byte_level = False
        if tokenizer is not None:
            ids = tokenizer.encode(" a", add_special_tokens=False)
            self.byte_level = "Ġ" in "".join(tokenizer.convert_ids_to_tokens(ids))

    def __call__(self, token: str) -> bytes:
        if self.byte_level:
            decoder = _byte_decoder()
            if all(ch in decoder for ch in token):
                return bytes(decoder[ch] for ch in token)
        if len(token) == 6 and token.startswith("<0x") and token.endswith(">"):
            return bytes([int(token[3:5], 16)])
        return token.replace("\u2581", " ").encode("utf-8")


def _top(raw: str, logprob: float, to_bytes: TokenBytes) -> TopLogprob:
    data = to_bytes(raw)
    # A token may hold part of a multi-byte character: show what decodes.
    return TopLogprob(data.decode("utf-8", errors="replace"), logprob, tuple(data))


def token_logprobs(
    logprobs: list[Any] | None, to_bytes: TokenBytes
) -> tuple[TokenLogprob, ...] | None:
    """Engine TokenLogprob records as the wire's (tokens as text and bytes)."""
    if logprobs is None:
        return None
    out = []
    for lp in logprobs:
        own = _top(lp.token, lp.logprob, to_bytes)
        top = tuple(_top(tok, value, to_bytes) for _, tok, value in lp.top)
        out.append(TokenLogprob(own.token, own.logprob, own.bytes, top))
    return tuple(out)


def prompt_logprobs(entries: list[Any] | None) -> PromptLogprobs | None:
    """Engine prompt logprobs as vLLM reports them: per prompt token None
    (the first, which nothing predicts) or the token itself, then its top
    alternatives, each with its rank."""
    if entries is None:
        return None
    body: list[tuple[PromptLogprob, ...] | None] = []
    for entry in entries:
        if entry is None:
            body.append(None)
            continue
        ranked = {tid: (rank, tok, lp) for rank, (tid, tok, lp) in enumerate(entry.top, 1)}
        # The prompt's own token first; its rank is known when it is among
        # the alternatives (vLLM computes it always; None says "not among them").
        own_rank = ranked.get(entry.token_id, (None,))[0]
        candidates = [PromptLogprob(entry.token_id, entry.logprob, own_rank, entry.token)]
        candidates += [
            PromptLogprob(tid, lp, rank, tok)
            for tid, (rank, tok, lp) in ranked.items()
            if tid != entry.token_id
        ]
        body.append(tuple(candidates))
    return tuple(body)


@dataclass(slots=True)
class _Response:
    request: GenerationRequest
    seq: int = 1
    # Wall-clock times, comparable with request.created_at (set by the web tier).
    added_at: float = field(default_factory=time.time)
    first_token_at: float | None = None
    # When the previous delta's tokens came (inter-token latency).
    last_token_at: float | None = None
    engine_queue_time: float | None = None
    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0
    finish_reasons: dict[int, str] = field(default_factory=dict)
    # The worker's root span for this response (None while not tracing).
    span: Any = None
    # (positions, step start, step end) of each prefill chunk, while tracing.
    prefill_chunks: list[tuple[range, float, float]] = field(default_factory=list)

    def queue_seconds(self) -> float | None:
        """Enqueue on the web tier to first scheduled by the engine."""
        if self.engine_queue_time is None:
            return None
        return (self.added_at - self.request.created_at) + self.engine_queue_time

    def phases(self) -> RequestPhases:
        """Prefill, decode and inference time, on the worker's clock."""
        scheduled = None
        if self.engine_queue_time is not None:
            scheduled = self.added_at + self.engine_queue_time
        first, last = self.first_token_at, self.last_token_at
        return RequestPhases(
            prefill=None if first is None or scheduled is None else first - scheduled,
            decode=None if first is None or last is None else last - first,
            inference=None if last is None or scheduled is None else last - scheduled,
            prompt_tokens=self.prompt_tokens,
            generation_tokens=self.completion_tokens,
        )

    def usage(self) -> TokenUsage:
        return TokenUsage(
            prompt_tokens=self.prompt_tokens,
            completion_tokens=self.completion_tokens,
            cached_tokens=self.cached_tokens,
        )

    def metrics(self) -> Timings:
        start = self.request.created_at
        queue = self.queue_seconds()
        ttft = None if self.first_token_at is None else self.first_token_at - start
        return Timings(
            queue_time_ms=_ms(queue), ttft_ms=_ms(ttft), duration_ms=_ms(time.time() - start)
        )


class ResponseTracker:
    """The in-flight responses of one worker and their unpublished events."""

    def __init__(
        self,
        *,
        worker_id: str,
        model: str,
        tokenizer: Any | None = None,
        metrics: WorkerMetrics | None = None,
        version: str = "",
        usage_stream: UsageStream | None = None,
    ):
        self.worker_id = worker_id
        self.model = model
        self.version = version
        # Looked up on first use: the bus is configured by then.
        self._usage_stream = usage_stream
        self._usage: list[UsageEntry] = []
        self.token_bytes = TokenBytes(tokenizer)
        self.metrics = metrics or WorkerMetrics(model)
        self.active: dict[str, _Response] = {}
        self._batch: list[tuple[str, Event]] = []

    def open(self, request: GenerationRequest) -> None:
        """Start a response: queue its ``created`` event."""
        response = _Response(request, prompt_tokens=len(request.prompt_token_ids))
        response.span = request_span_start(
            request, worker_id=self.worker_id, model=self.model, at=response.added_at
        )
        self.active[request.response_id] = response
        self._batch.append((request.response_id, self._created(request)))

    def reject(self, request: GenerationRequest, error: ErrorInfo) -> None:
        """Answer a request that never reaches the engine: created, then failed."""
        self.open(request)
        self.fail(request.response_id, error)

    def fail(self, response_id: str, error: ErrorInfo) -> None:
        """End a response with ``failed``, keeping the usage counted so far."""
        response = self.active.pop(response_id, None)
        if response is None:
            return
        response.seq += 1
        event = Terminal(
            EventType.FAILED,
            response.seq,
            usage=response.usage(),
            metrics=response.metrics(),
            finish_reasons=dict(response.finish_reasons),
            error=error,
        )
        self._batch.append((response_id, event))
        self._report_usage(response.request, event)
        request_span_end(
            response.span, response, outcome=EventType.FAILED.value, at=time.time(), error=error
        )

    def forget(self, response_id: str) -> bool:
        """Stop tracking without an event (the stream was ended elsewhere)."""
        response = self.active.pop(response_id, None)
        if response is None:
            return False
        closed = ErrorInfo("The stream was ended by the web tier", code="stream_closed")
        request_span_end(response.span, response, outcome="closed", at=time.time(), error=closed)
        return True

    def on_prefill_chunks(
        self, chunks: list[tuple[str, range]], started: float, ended: float
    ) -> None:
        """Note the prefill chunks one engine step computed (for the traces)."""
        for response_id, positions in chunks:
            response = self.active.get(response_id)
            if response is not None and response.span is not None:
                response.prefill_chunks.append((positions, started, ended))

    def on_output(self, output: Any) -> None:
        """Turn one engine RequestOutput into a delta and maybe a terminal event."""
        response = self.active.get(output.request_id)
        if response is None:
            return  # warm-up traffic, or a response already failed/forgotten
        now = time.time()
        response.prompt_tokens = output.num_prompt_tokens
        response.cached_tokens = output.num_cached_tokens
        if output.queue_time is not None:
            response.engine_queue_time = output.queue_time
        choices = []
        produced = False
        for choice in output.choices:
            response.completion_tokens += len(choice.token_ids)
            if choice.token_ids:
                produced = True
                if response.first_token_at is None:
                    response.first_token_at = now
            reason = choice.finish_reason
            if reason:
                response.finish_reasons[choice.index] = reason
            client_reason = reason if reason in CLIENT_FINISH_REASONS else None
            if choice.token_ids or choice.text or client_reason:
                choices.append(
                    ChoiceDelta(
                        index=choice.index,
                        text=choice.text,
                        token_ids=tuple(choice.token_ids),
                        logprobs=token_logprobs(choice.logprobs, self.token_bytes),
                        finish_reason=client_reason,
                    )
                )
        if produced:
            self._observe_tokens(response, now)
        if choices:
            response.seq += 1
            delta = Delta(response.seq, tuple(choices), prompt_logprobs(output.prompt_logprobs))
            self._batch.append((output.request_id, delta))
        if output.finished:
            self._finish(output.request_id, response)

    def _observe_tokens(self, response: _Response, now: float) -> None:
        """TTFT on a response's first tokens, inter-token latency after."""
        if response.last_token_at is None:
            self.metrics.first_token(
                ttft=now - response.request.created_at,
                prompt_tokens=response.prompt_tokens,
                cached_tokens=response.cached_tokens,
            )
        else:
            self.metrics.next_tokens(now - response.last_token_at)
        response.last_token_at = now

    def _finish(self, response_id: str, response: _Response) -> None:
        del self.active[response_id]
        aborted = "abort" in response.finish_reasons.values()
        response.seq += 1
        kind = EventType.CANCELLED if aborted else EventType.COMPLETED
        event = Terminal(
            kind,
            response.seq,
            usage=response.usage(),
            metrics=response.metrics(),
            finish_reasons=dict(sorted(response.finish_reasons.items())),
        )
        self._batch.append((response_id, event))
        self._report_usage(response.request, event)
        now = time.time()
        reason = "abort" if aborted else response.finish_reasons.get(0, "stop")
        self.metrics.finished(
            reason=reason,
            e2e=now - response.request.created_at,
            queue=response.queue_seconds(),
            phases=response.phases(),
        )
        request_span_end(response.span, response, outcome=kind.value, at=now)

    def _report_usage(self, request: GenerationRequest, terminal: Terminal) -> None:
        if request.usage_tag is None or request.tenant_id is None:
            return  # not billed: a shadow copy
        entry = usage_entry(
            response_id=request.response_id,
            tenant_id=request.tenant_id,
            model=request.model,
            tag=request.usage_tag,
            terminal=terminal,
            created_at=request.created_at,
            finished_at=time.time(),
            worker_id=self.worker_id,
            model_version=self.version,
        )
        self._usage.append(entry)

    def take_batch(self) -> list[tuple[str, Event]]:
        """The events to publish, after appending the batch's usage entries."""
        self._send_usage()
        batch, self._batch = self._batch, []
        return batch

    def _send_usage(self) -> None:
        if not self._usage:
            return
        try:
            if self._usage_stream is None:
                self._usage_stream = get_usage_stream()
            self._usage_stream.append(self._usage)
        except Exception:
            # Kept for the next flush: the settler is the record's second
            # writer, and the web tier may be gone.
            excess = len(self._usage) - MAX_UNSENT_USAGE
            if excess > 0:
                lost = [e.response_id for e in self._usage[:excess]]
                del self._usage[:excess]
                logger.error("usage of %d responses dropped: %s", len(lost), lost[:20])
            logger.warning("usage stream unreachable; %d entries kept", len(self._usage))
            return
        self._usage = []

    def _created(self, request: GenerationRequest) -> Created:
        return Created(
            response_id=request.response_id,
            model=self.model,
            worker_id=self.worker_id,
            prompt_tokens=len(request.prompt_token_ids),
        )
