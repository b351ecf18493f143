"""Prompt preparation: a screened request -> prompt tokens and bounded sampling.

Runs in the web process before any GPU work: the chat template (a
``ChatPrompt``) or the text as it is (a ``TextPrompt``), the tokenizer, then
the output bound every surface shares (``output_bound``), so a prompt over
the context cap is a 400 before anything is counted or dispatched.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import jinja2

from fleet.models import ServedModel
from fleet.selectors import served_model_dir
from inference.errors import ContextLengthExceeded, InvalidRequest, ServiceUnavailable
from inference.prompts.sampling import sampling_checked
from inference.request import ChatPrompt, InferenceRequest, TextPrompt
from inference.tool_calls.template import prompt_render, template_messages
from tenants.models import Tier
from tokenization import ModelFilesMissing, load_tokenizer
from wire.sampling import Sampling


@dataclass(slots=True, frozen=True)
class PreparedPrompt:
    prompt_token_ids: list[int]
    # Bounded (max_tokens set) and checked against the model.
    sampling: Sampling


def model_tokenizer(model: ServedModel):
    """The model's tokenizer; 503 ``model_warming_up`` while its files are not
    there yet (set-up or the worker converting the demo model)."""
    try:
        return load_tokenizer(served_model_dir(model=model))
    except ModelFilesMissing as exc:
        raise ServiceUnavailable(str(exc), code="model_warming_up") from exc


def prompt_prepare(*, request: InferenceRequest, model: ServedModel, tier: Tier) -> PreparedPrompt:
    """Tokenize the prompt and bound the completion, before any GPU work.

    The context cap is the smaller of the tier's and the model's; a prompt
    plus max_tokens over it is a 400 ``context_length_exceeded``. Without a
    max_tokens the completion may use the tier's output cap (or the
    request's ``default_max_tokens``, when smaller) or whatever context
    remains, whichever is smaller.
    """
    tokenizer = model_tokenizer(model)
    prompt = request.prompt
    if isinstance(prompt, ChatPrompt):
        ids = _chat_ids(tokenizer, prompt, model)
        constraint = "tool_choice" if prompt.constrained_by_tools else "response_format"
    else:
        ids = _text_ids(tokenizer, prompt)
        constraint = "response_format"
    max_tokens = output_bound(prompt_tokens=len(ids), request=request, model=model, tier=tier)
    sampling = sampling_checked(
        replace(request.sampling, max_tokens=max_tokens),
        vocab_size=len(tokenizer),
        constraint_param=constraint,
    )
    return PreparedPrompt(prompt_token_ids=ids, sampling=sampling)


def _chat_ids(tokenizer, prompt: ChatPrompt, model: ServedModel) -> list[int]:
    try:
        return prompt_render(
            tokenizer,
            template_messages(prompt.turns),
            tools=prompt.template_tools,
            model=model.name,
        )
    except (jinja2.TemplateError, ValueError) as exc:
        raise InvalidRequest(
            f"The messages cannot be rendered with this model's chat template: {exc}",
            param="messages",
        ) from exc


def _text_ids(tokenizer, prompt: TextPrompt) -> list[int]:
    """The prompt's token ids: as the client sent them, else its text's."""
    ids = list(prompt.token_ids) if prompt.token_ids is not None else tokenizer.encode(prompt.text)
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
    return ids


def output_bound(
    *, prompt_tokens: int, request: InferenceRequest, model: ServedModel, tier: Tier
) -> int:
    """The completion's max_tokens for a prompt of ``prompt_tokens``, or a 400.

    Shared by every surface: the tier's output cap, the context cap (the
    smaller of the tier's and the model's) and the client's own cap.
    """
    limit = min(tier.max_context_tokens, model.context_length)
    param, requested = request.max_tokens_param, request.sampling.max_tokens
    if requested is not None and requested > tier.max_output_tokens:
        raise InvalidRequest(
            f"{param} is too large: {requested}. This model supports at most "
            f"{tier.max_output_tokens} completion tokens on the {tier.name} tier.",
            param=param,
            code="integer_above_max_value",
        )
    default_cap = request.default_max_tokens or tier.max_output_tokens
    output_cap = min(tier.max_output_tokens, default_cap)
    max_tokens = requested or min(output_cap, limit - prompt_tokens)
    if prompt_tokens + max(max_tokens, 1) > limit:
        raise ContextLengthExceeded(
            f"This model's maximum context length is {limit} tokens. However, you "
            f"requested {prompt_tokens + max(max_tokens, 1)} tokens ({prompt_tokens} in the "
            f"messages, {max(max_tokens, 1)} in the completion). Please reduce the length "
            "of the messages or completion.",
            limit=limit,
            prompt_tokens=prompt_tokens,
        )
    return max_tokens
