"""``/v1/completions``: OpenAI's legacy text completions, on the chat path.

A completion request becomes one ``ChatCompletionRequest`` per prompt (the
prompt as its one user message, which moderation screens and routing keys
on) and goes through ``services.completion_start`` like chat: the same
auth, tiers, limits, budgets, usage records, moderation and cancellation.
Only the prompt preparation differs: the prompt is tokenized as it is (or
taken as token ids), without the chat template. A list of prompts is one
response per prompt (each admitted and billed on its own), read together
by ``MultiTap`` and numbered as OpenAI numbers them: choice
``prompt_index * n + j``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Annotated, Any

from asgiref.sync import sync_to_async
from pydantic import Field, create_model, field_validator, model_validator

from fleet.models import ServedModel
from fleet.selectors import catalog_model_get, served_model_dir
from inference import services
from inference.api.completions_format import CompletionFrames, PromptEcho, completion_result
from inference.api.schemas import ENCODABLE, ChatCompletionRequest, StrictSchema, TokenId
from inference.api.sse import RESUMABLE_HEADER, stream_response, wants_resumable
from inference.errors import InvalidRequest
from inference.prompts.prepare import PreparedPrompt, output_bound
from inference.prompts.sampling import sampling_for
from inference.relay.multitap import MultiTap
from inference.relay.tap import failed_error, release_db_connection
from sampling_rules.limits import MAX_N, MAX_TOP_LOGPROBS
from tenants.models import ApiKey, Tier
from tokenization.tokenizer import load_tokenizer
from wire.events import TERMINAL_EVENTS, EventType

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
)
_Shared = create_model(
    "_SharedSampling",
    __base__=StrictSchema,
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


@dataclass(slots=True)
class PromptSpec:
    """One prompt of a request, and what its preparation learned."""

    text: str
    token_ids: list[int] | None
    # Each prompt token as text, for echo with logprobs.
    prompt_tokens: list[str] = field(default_factory=list)
    to_text: Callable[[str], str] = str


def completion_prompt_prepare(
    *,
    request: ChatCompletionRequest,
    model: ServedModel,
    tier: Tier,
    default_max_tokens: int | None = None,
    spec: PromptSpec,
    echo_logprobs: int | None,
) -> PreparedPrompt:
    """Tokenize the (screened) prompt as it is, and bound the completion."""
    tokenizer = load_tokenizer(str(served_model_dir(model=model)))
    text = request.messages[0].text
    # Token ids are served as given unless moderation redacted their text.
    if spec.token_ids is not None and text == spec.text:
        ids = spec.token_ids
    else:
        ids = tokenizer.encode(text)
    if not ids:
        raise InvalidRequest("prompt must not be empty.", param="prompt")
    vocab = len(tokenizer)
    if max(ids) >= vocab:
        raise InvalidRequest(
            f"prompt names token id {max(ids)}, but this model's vocabulary has {vocab} "
            f"tokens (ids 0 to {vocab - 1}).",
            param="prompt",
            code="invalid_value",
        )
    max_tokens = output_bound(
        prompt_tokens=len(ids),
        request=request,
        model=model,
        tier=tier,
        default_max_tokens=default_max_tokens,
    )
    sampling = sampling_for(request, max_tokens, vocab)
    if echo_logprobs is not None:
        # echo with logprobs scores the prompt too (vLLM's prompt_logprobs).
        sampling["prompt_logprobs"] = max(sampling["prompt_logprobs"] or 0, echo_logprobs)
    if echo_logprobs is not None:
        spec.prompt_tokens = [tokenizer.decode([i]) for i in ids]
        spec.to_text = lambda token: tokenizer.convert_tokens_to_string([token])
    return PreparedPrompt(prompt_token_ids=ids, sampling=sampling)


def chat_request_for(request: CompletionRequest, text: str) -> ChatCompletionRequest:
    """The chat-path request for one prompt: same sampling, the prompt as a message."""
    shared = request.model_dump(include=set(SHARED_FIELDS), exclude_none=True)
    shared.setdefault("max_tokens", DEFAULT_MAX_TOKENS)
    if request.logprobs is not None:
        # Legacy logprobs=N: the sampled token's logprob and N alternatives.
        shared.update(logprobs=True, top_logprobs=request.logprobs or None)
    return ChatCompletionRequest.model_validate(
        {**shared, "model": request.model, "messages": [{"role": "user", "content": text}]}
    )


async def completions_create(
    *, api_key: ApiKey, request: CompletionRequest, headers: dict[str, str]
):
    """Admit every prompt, then answer one text_completion (or its SSE stream)."""
    specs = await sync_to_async(_specs, thread_sensitive=False)(
        request=request, tier=api_key.tenant.tier
    )
    echo_logprobs = request.logprobs if request.echo else None
    taps = []
    try:
        for spec in specs:
            taps.append(
                await services.completion_start(
                    tenant=api_key.tenant,
                    request=chat_request_for(request, spec.text),
                    api_key=api_key,
                    prepare=_Preparer(spec, echo_logprobs),
                    id_prefix="cmpl",
                )
            )
    except BaseException:
        # A later prompt was refused: the earlier ones must not run unread.
        for tap in taps:
            tap.abandon()
        raise
    merged = MultiTap(taps, n=request.n or 1)
    echoes = [
        PromptEcho(s.text, s.prompt_tokens, s.to_text) if request.echo else None for s in specs
    ]
    frames = CompletionFrames(
        merged.route.response_id,
        merged.route.model,
        merged.route.created,
        merged.route.n,
        echoes=echoes,
        logprobs=request.logprobs,
        include_usage=bool(request.stream_options and request.stream_options.include_usage),
    )
    if request.stream:
        resumable = wants_resumable(headers.get(RESUMABLE_HEADER))
        return await stream_response(merged, frames=frames, resumable=resumable)
    return await _collected(merged, frames, want_prompt_logprobs=request.prompt_logprobs)


@dataclass(slots=True)
class _Preparer:
    spec: PromptSpec
    echo_logprobs: int | None

    def __call__(self, **kwargs: Any) -> PreparedPrompt:
        return completion_prompt_prepare(**kwargs, spec=self.spec, echo_logprobs=self.echo_logprobs)


def _specs(*, request: CompletionRequest, tier: Tier) -> list[PromptSpec]:
    prompts = request.prompts
    if all(isinstance(p, str) for p in prompts):
        return [PromptSpec(text=p, token_ids=None) for p in prompts]
    # Token ids: their text is what moderation screens and echo returns.
    model = catalog_model_get(name=request.model, tier=tier)
    if model is None:
        # Unknown to the tier: completion_start answers 404 model_not_found.
        return [PromptSpec(text="", token_ids=list(p)) for p in prompts]
    tokenizer = load_tokenizer(str(served_model_dir(model=model)))
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
    return [PromptSpec(text=tokenizer.decode(ids), token_ids=list(ids)) for ids in prompts]


async def _collected(merged: MultiTap, frames: CompletionFrames, *, want_prompt_logprobs):
    from django.http import JsonResponse

    await release_db_connection()
    payloads: list[dict[str, Any]] = []
    try:
        while True:
            event = await merged.next_event()
            if event is None:
                continue
            payloads.extend(frames.payloads(event))
            if event["type"] in TERMINAL_EVENTS:
                break
    except BaseException:
        merged.abandon()
        raise
    if event["type"] in (EventType.FAILED, EventType.CANCELLED):
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
