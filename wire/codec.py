"""The one encoder and decoder of what crosses the bus: events and requests.

Both transports (Redis Streams, the in-process bus) store JSON text made
here and hand back records made here; nothing else reads an event's or a
request's JSON. The JSON shapes are the stream contract's
(docs/architecture.md, "Stream contract"), unchanged from when dicts
crossed: a worker and a web process of different versions read each
other's messages during a rolling deploy. Decoders ignore fields they do
not know and fill in defaults for those an older sender leaves out.
"""

from __future__ import annotations

import json
from dataclasses import fields
from typing import Any

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
from wire.requests import GenerationRequest, ServiceClass
from wire.sampling import Sampling
from wire.usage.entry import UsageTag

_COMPACT = (",", ":")


class UndecodableMessage(ValueError):
    """A message on the bus that is not one of ours (or is corrupt)."""


# -- events ------------------------------------------------------------------


def encode_event(event: Event) -> str:
    """An event's JSON text, as the bus stores it."""
    return json.dumps(_event_json(event), separators=_COMPACT)


def encode_event_without_seq(event: Event) -> str:
    """An event's JSON text minus ``seq``, for a bus that assigns the seq
    itself (``Bus.publish_if_open``): the text starts with ``{"type":``."""
    body = _event_json(event)
    del body["seq"]
    return json.dumps(body, separators=_COMPACT)


def decode_event(text: str | bytes) -> Event:
    """The event a JSON text encodes; raises UndecodableMessage."""
    try:
        data = json.loads(text)
        kind = EventType(data["type"])
        if kind == EventType.DELTA:
            return Delta(
                seq=int(data["seq"]),
                choices=tuple(_choice(c) for c in data["choices"]),
                prompt_logprobs=_prompt_logprobs(data.get("prompt_logprobs")),
            )
        if kind == EventType.CREATED:
            return Created(
                response_id=data["response_id"],
                model=data["model"],
                worker_id=data.get("worker_id") or "",
                prompt_tokens=int(data.get("prompt_tokens") or 0),
                created=int(data["created"]),
                seq=int(data["seq"]),
            )
        error = data.get("error")
        return Terminal(
            type=kind,
            seq=int(data["seq"]),
            usage=_known(TokenUsage, data.get("usage")),
            metrics=_known(Timings, data.get("metrics")),
            finish_reasons={int(k): v for k, v in (data.get("finish_reasons") or {}).items()},
            error=_known(ErrorInfo, error) if error else None,
        )
    except (TypeError, ValueError, KeyError, AttributeError) as exc:
        raise UndecodableMessage(f"not an event: {exc!r}") from exc


def _event_json(event: Event) -> dict[str, Any]:
    if isinstance(event, Delta):
        body: dict[str, Any] = {
            "type": EventType.DELTA.value,
            "seq": event.seq,
            "choices": [_choice_json(c) for c in event.choices],
        }
        if event.prompt_logprobs is not None:
            body["prompt_logprobs"] = prompt_logprobs_json(event.prompt_logprobs)
        return body
    if isinstance(event, Created):
        return {
            "type": EventType.CREATED.value,
            "seq": event.seq,
            "response_id": event.response_id,
            "model": event.model,
            "worker_id": event.worker_id,
            "created": event.created,
            "prompt_tokens": event.prompt_tokens,
        }
    usage, metrics = event.usage, event.metrics
    body = {
        "type": event.type.value,
        "seq": event.seq,
        "usage": {
            "prompt_tokens": usage.prompt_tokens,
            "completion_tokens": usage.completion_tokens,
            "cached_tokens": usage.cached_tokens,
        },
        "metrics": {
            "queue_time_ms": metrics.queue_time_ms,
            "ttft_ms": metrics.ttft_ms,
            "duration_ms": metrics.duration_ms,
        },
        "finish_reasons": {str(k): v for k, v in event.finish_reasons.items()},
    }
    if event.error is not None:
        body["error"] = error_json(event.error)
    return body


def error_json(error: ErrorInfo) -> dict[str, str | None]:
    """OpenAI's error object: ``{"message", "type", "param", "code"}``."""
    return {"message": error.message, "type": error.type, "param": error.param, "code": error.code}


def _choice_json(choice: ChoiceDelta) -> dict[str, Any]:
    return {
        "index": choice.index,
        "text": choice.text,
        "token_ids": list(choice.token_ids),
        "logprobs": None if choice.logprobs is None else [logprob_json(e) for e in choice.logprobs],
        "finish_reason": choice.finish_reason,
    }


def _choice(data: dict[str, Any]) -> ChoiceDelta:
    logprobs = data.get("logprobs")
    return ChoiceDelta(
        index=int(data.get("index", 0)),
        text=data.get("text") or "",
        token_ids=tuple(data.get("token_ids") or ()),
        logprobs=None if logprobs is None else tuple(_logprob(e) for e in logprobs),
        finish_reason=data.get("finish_reason"),
    )


def logprob_json(entry: TokenLogprob) -> dict[str, Any]:
    """A generated token's logprob in OpenAI's ``logprobs.content`` shape."""
    return {
        "token": entry.token,
        "logprob": entry.logprob,
        "bytes": list(entry.bytes),
        "top_logprobs": [
            {"token": t.token, "logprob": t.logprob, "bytes": list(t.bytes)}
            for t in entry.top_logprobs
        ],
    }


def _logprob(data: dict[str, Any]) -> TokenLogprob:
    return TokenLogprob(
        token=data["token"],
        logprob=float(data["logprob"]),
        bytes=tuple(data.get("bytes") or ()),
        top_logprobs=tuple(
            TopLogprob(t["token"], float(t["logprob"]), tuple(t.get("bytes") or ()))
            for t in data.get("top_logprobs") or ()
        ),
    )


def prompt_logprobs_json(entries: PromptLogprobs) -> list[dict[str, dict[str, Any]] | None]:
    """vLLM's prompt_logprobs shape: per position None or ``{token id:
    {logprob, rank, decoded_token}}``, the prompt's own token first."""
    return [
        None
        if position is None
        else {
            str(c.token_id): {
                "logprob": c.logprob,
                "rank": c.rank,
                "decoded_token": c.decoded_token,
            }
            for c in position
        }
        for position in entries
    ]


def _prompt_logprobs(data: list | None) -> PromptLogprobs | None:
    if data is None:
        return None
    return tuple(
        None
        if position is None
        else tuple(
            PromptLogprob(int(tid), float(c["logprob"]), c.get("rank"), c["decoded_token"])
            for tid, c in position.items()
        )
        for position in data
    )


def _known(cls: type, data: dict[str, Any] | None):
    """``cls`` from the fields of ``data`` it knows (defaults for the rest)."""
    return cls(**{k: v for k, v in (data or {}).items() if k in _field_names(cls)})


_FIELD_NAMES: dict[type, frozenset[str]] = {}


def _field_names(cls: type) -> frozenset[str]:
    names = _FIELD_NAMES.get(cls)
    if names is None:
        names = _FIELD_NAMES[cls] = frozenset(f.name for f in fields(cls))
    return names


# -- requests ----------------------------------------------------------------


def encode_request(request: GenerationRequest) -> str:
    """A generation request's JSON text, as a worker's inbox stores it."""
    tag = request.usage_tag
    body = {
        "response_id": request.response_id,
        "model": request.model,
        "prompt_token_ids": request.prompt_token_ids,
        "sampling": sampling_json(request.sampling),
        "priority": request.priority,
        "tier": request.tier,
        "tenant_id": request.tenant_id,
        "service_class": request.service_class.value,
        "cache_salt": request.cache_salt,
        "created_at": request.created_at,
        "traceparent": request.traceparent,
        "request_id": request.request_id,
        "usage_tag": None if tag is None else {f: getattr(tag, f) for f in _field_names(UsageTag)},
    }
    return json.dumps(body, separators=_COMPACT)


def decode_request(text: str | bytes) -> GenerationRequest:
    """The generation request a JSON text encodes; raises UndecodableMessage."""
    try:
        data = json.loads(text)
        known = {k: v for k, v in data.items() if k in _field_names(GenerationRequest)}
        known["sampling"] = sampling_from_json(data["sampling"])
        known["service_class"] = ServiceClass(known.get("service_class") or "default")
        if isinstance(known.get("usage_tag"), dict):
            known["usage_tag"] = _known(UsageTag, known["usage_tag"])
        return GenerationRequest(**known)
    except (TypeError, ValueError, KeyError, AttributeError) as exc:
        raise UndecodableMessage(f"not a generation request: {exc!r}") from exc


def sampling_json(sampling: Sampling) -> dict[str, Any]:
    """The sampling settings as JSON values (token ids as string keys)."""
    body = {f: getattr(sampling, f) for f in _field_names(Sampling)}
    for name in ("stop", "stop_token_ids", "bad_words"):
        body[name] = list(body[name])
    body["logit_bias"] = {str(k): v for k, v in sampling.logit_bias.items()}
    return body


def sampling_from_json(data: dict[str, Any]) -> Sampling:
    known = {k: v for k, v in data.items() if k in _field_names(Sampling)}
    for name in ("stop", "stop_token_ids", "bad_words"):
        if name in known:
            value = known[name]
            known[name] = (value,) if isinstance(value, str) else tuple(value or ())
    if "logit_bias" in known:
        known["logit_bias"] = {int(k): float(v) for k, v in (known["logit_bias"] or {}).items()}
    return Sampling(**known)
