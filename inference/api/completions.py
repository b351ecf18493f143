"""``/v1/completions``: OpenAI's legacy text completions, on the chat path.

A completion request becomes one ``InferenceRequest`` per prompt, whose
prompt is a ``TextPrompt`` (the text, and the token ids when the client
sent ids), and goes through ``services.generation_start`` like chat: the
same auth, tiers, limits, budgets, usage records, moderation and
cancellation. The prompt is tokenized as it is (or taken as token ids),
without the chat template. A list of prompts is one
response per prompt (each admitted and billed on its own), read together
by ``MultiTap`` and numbered as OpenAI numbers them: choice
``prompt_index * n + j``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any

from pydantic import Field, create_model, field_validator, model_validator

from fleet.selectors import catalog_model_get
from inference import services
from inference.api.chat import sampling_of
from inference.api.completions_format import CompletionFrames, PromptEcho, completion_result
from inference.api.schemas import (
    ENCODABLE,
    ChatCompletionRequest,
    RequestBody,
    TokenId,
    stream_rules_check,
)
from inference.api.sse import RESUMABLE_HEADER, stream_response, wants_resumable
from inference.errors import InvalidRequest
from inference.offload import offloaded
from inference.prompts.prepare import model_tokenizer
from inference.relay.multitap import MultiTap
from inference.relay.tap import (
    ResponseTap,
    collect,
    ended_badly,
    failed_error,
    release_db_connection,
)
from inference.request import InferenceRequest, TextPrompt, new_response_id
from inference.service_tier import service_class_for
from sampling_rules.limits import MAX_N, MAX_TOP_LOGPROBS
from tenants.models import ApiKey, Tenant, Tier
from wire.events import Event
from wire.tracing import TraceContext

# OpenAI's (and vLLM's) default for the legacy endpoint: 16 tokens.
DEFAULT_MAX_TOKENS = 16
# Most prompts in one request; each is a response of its own.
MAX_PROMPTS = MAX_N

# The sampling parameters completions shares with chat, declared once on
# ChatCompletionRequest (so bounds and new vLLM extras stay in step).
SHARED_FIELDS = (
    "max_tokens",
    "temperature",
    "top_p",
    "n",
    "stop",
    "seed",
    "stream",
    "stream_options",
    "user",
    "presence_penalty",
    "frequency_penalty",
    "logit_bias",
    "top_k",
    "min_p",
    "repetition_penalty",
    "min_tokens",
    "ignore_eos",
    "stop_token_ids",
    "bad_words",
    "include_stop_str_in_output",
    "skip_special_tokens",
    "prompt_logprobs",
    "deterministic",
    "service_tier",
)
_Shared = create_model(
    "_SharedSampling",
    __base__=RequestBody,
    **{
        name: (info.annotation, info)
        for name, info in ChatCompletionRequest.model_fields.items()
        if name in SHARED_FIELDS
    },
)

Text = Annotated[str, ENCODABLE]
TokenIds = Annotated[list[TokenId], Field(min_length=1)]
Prompt = (
    Text
    | Annotated[list[Text], Field(min_length=1, max_length=MAX_PROMPTS)]
    | TokenIds
    | Annotated[list[TokenIds], Field(min_length=1, max_length=MAX_PROMPTS)]
)


class CompletionRequest(_Shared):
    model: Annotated[str, Field(min_length=1, max_length=128), ENCODABLE]
    prompt: Prompt
    echo: bool | None = None
    # Legacy logprobs: how many alternatives per token (0: the token's own only).
    logprobs: Annotated[int, Field(ge=0, le=MAX_TOP_LOGPROBS)] | None = None
    suffix: Text | None = None
    # OpenAI's best_of: served when it equals n (each choice is its own
    # best); more candidates than choices would need server-side ranking.
    best_of: Annotated[int, Field(ge=1, le=MAX_N)] | None = None

    @field_validator("logit_bias")
    @classmethod
    def _token_id_keys(cls, value: dict[str, float] | None) -> dict[str, float] | None:
        # Chat's own rule, so both endpoints word the 400 alike.
        return ChatCompletionRequest._token_id_keys(value)

    @field_validator("suffix")
    @classmethod
    def _no_suffix(cls, value: str | None) -> str | None:
        if value:
            # Insertion needs a fill-in-the-middle model; the demo model is not one.
            raise InvalidRequest("suffix is not supported by this server.", param="suffix")
        return value

    @model_validator(mode="after")
    def _prompts_fit(self) -> CompletionRequest:
        stream_rules_check(self)
        if self.best_of is not None and self.best_of != (self.n or 1):
            raise InvalidRequest(
                "best_of is supported only equal to n (no server-side ranking of candidates).",
                param="best_of",
                code="unsupported_value",
            )
        if len(self.prompts) * (self.n or 1) > MAX_PROMPTS * MAX_N:
            raise InvalidRequest("Too many prompts times n.", param="prompt")
        if any(p == "" for p in self.prompts):
            raise InvalidRequest("prompt must not be empty.", param="prompt")
        return self

    @property
    def prompts(self) -> list[str | list[int]]:
        """Each prompt as text or as token ids."""
        prompt = self.prompt
        if isinstance(prompt, str):
            return [prompt]
        if isinstance(prompt[0], int):
            return [prompt]
        return list(prompt)


def completion_requests(
    request: CompletionRequest, *, tenant: Tenant, texts: list[str]
) -> list[InferenceRequest]:
    """The internal request of each prompt (its text, and its token ids when
    the client sent ids): same sampling, no chat template."""
    # Legacy logprobs=N: the sampled token's logprob and N alternatives;
    # with echo the prompt is scored too (vLLM's prompt_logprobs).
    logprobs = request.logprobs
    prompt_logprobs = request.prompt_logprobs
    if request.echo and logprobs is not None:
        prompt_logprobs = max(prompt_logprobs or 0, logprobs)
    sampling = sampling_of(
        request,
        max_tokens=DEFAULT_MAX_TOKENS if request.max_tokens is None else request.max_tokens,
        logprobs=logprobs is not None,
        top_logprobs=logprobs or 0,
        prompt_logprobs=prompt_logprobs,
    )
    trace = TraceContext.current()
    prompts = request.prompts
    return [
        InferenceRequest(
            model=request.model,
            prompt=TextPrompt(text, None if isinstance(prompt, str) else tuple(prompt)),
            sampling=sampling,
            tenant_id=tenant.pk,
            tier=tenant.tier.name,
            response_id=new_response_id("cmpl"),
            trace=trace,
            user=request.user,
            include_usage=bool(request.stream_options and request.stream_options.include_usage),
            service_class=service_class_for(requested=request.service_tier, tier=tenant.tier),
        )
        for prompt, text in zip(prompts, texts, strict=True)
    ]


async def completions_create(
    *,
    api_key: ApiKey,
    request: CompletionRequest,
    headers: dict[str, str],
    prepare: Callable[[InferenceRequest], InferenceRequest] | None = None,
):
    """Admit every prompt, then answer one text_completion (or its SSE stream).

    ``prepare`` adjusts each prompt's internal request before it starts
    (the Batch API's lines: their service class, source and response ids).
    """
    tenant = api_key.tenant
    texts = await offloaded(_prompt_texts)(request=request, tier=tenant.tier)
    taps = []
    try:
        for internal in completion_requests(request, tenant=tenant, texts=texts):
            if prepare is not None:
                internal = prepare(internal)
            taps.append(
                await services.generation_start(request=internal, tenant=tenant, api_key=api_key)
            )
    except BaseException:
        # A later prompt was refused: the earlier ones must not run unread.
        for tap in taps:
            tap.abandon()
        raise
    merged = MultiTap(taps, n=request.n or 1)
    echoes: list[PromptEcho | None] = [None] * len(taps)
    if request.echo:
        echoes = await offloaded(_echoes)(request=request, tier=tenant.tier, texts=texts, taps=taps)
    frames = CompletionFrames(
        merged.route.response_id,
        merged.route.model,
        merged.route.created,
        merged.route.n,
        echoes=echoes,
        logprobs=request.logprobs,
        include_usage=bool(request.stream_options and request.stream_options.include_usage),
        service_tier=merged.route.service_tier,
    )
    if request.stream:
        resumable = wants_resumable(headers.get(RESUMABLE_HEADER))
        return await stream_response(merged, frames=frames, resumable=resumable)
    return await _collected(merged, frames, want_prompt_logprobs=request.prompt_logprobs)


def _prompt_texts(*, request: CompletionRequest, tier: Tier) -> list[str]:
    """Each prompt's text: as sent, or its token ids decoded (what
    moderation screens and echo returns)."""
    prompts = request.prompts
    if all(isinstance(p, str) for p in prompts):
        return list(prompts)
    model = catalog_model_get(name=request.model, tier=tier)
    if model is None:
        # Unknown to the tier: generation_start answers 404 model_not_found.
        return ["" for _ in prompts]
    tokenizer = model_tokenizer(model)
    vocab = len(tokenizer)
    for ids in prompts:
        bad = [i for i in ids if i >= vocab]
        if bad:
            raise InvalidRequest(
                f"prompt names token id {bad[0]}, but this model's vocabulary has {vocab} "
                f"tokens (ids 0 to {vocab - 1}).",
                param="prompt",
                code="invalid_value",
            )
    return [tokenizer.decode(ids) for ids in prompts]


def _echoes(
    *, request: CompletionRequest, tier: Tier, texts: list[str], taps: list[ResponseTap]
) -> list[PromptEcho | None]:
    """Each prompt as echo repeats it: its text and, for its logprobs, each
    of its tokens as text (as served, after any redaction)."""
    model = catalog_model_get(name=request.model, tier=tier)
    tokenizer = model_tokenizer(model)

    def to_text(token: str) -> str:
        return tokenizer.convert_tokens_to_string([token])

    def tokens(tap: ResponseTap) -> list[str]:
        if request.logprobs is None:
            return []
        return [tokenizer.decode([i]) for i in tap.prompt_token_ids or ()]

    return [PromptEcho(text, tokens(tap), to_text) for text, tap in zip(texts, taps, strict=True)]


async def _collected(merged: MultiTap, frames: CompletionFrames, *, want_prompt_logprobs):
    from django.http import JsonResponse

    await release_db_connection()
    payloads: list[dict[str, Any]] = []
    try:
        event = await collect(merged, _Into(frames, payloads))
    except BaseException:
        merged.abandon()
        raise
    if ended_badly(event):
        error = failed_error(event)
        error.headers = {**merged.headers, **error.headers}
        raise error
    result = completion_result(frames, payloads, event)
    if want_prompt_logprobs is not None:
        result["prompt_logprobs"] = merged.prompt_logprobs()
    response = JsonResponse(result)
    for name, value in merged.headers.items():
        response[name] = value
    return response


@dataclass(slots=True)
class _Into:
    """Collects the frames' bodies for a non-streamed answer."""

    frames: CompletionFrames
    payloads: list[dict[str, Any]]

    def add(self, event: Event) -> None:
        self.payloads.extend(self.frames.payloads(event))
