"""Prompt preparation: a screened request -> prompt tokens, sampling, output cap.

Runs in the web process before any GPU work: the chat template and the
tokenizer, then the output bound every endpoint shares (``output_bound``),
so a prompt over the context cap is a 400 before anything is counted or
dispatched. ``completion_start`` takes the preparer to use
(``PromptPreparer``): ``chat_prompt_prepare`` for chat and the Responses
API, ``inference.api.completions`` its own for raw text and token ids.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import jinja2

from fleet.models import ServedModel
from fleet.selectors import served_model_dir
from inference.api.schemas import ChatCompletionRequest
from inference.errors import ContextLengthExceeded, InvalidRequest
from inference.prompts.sampling import sampling_for
from inference.tool_calls.setup import tool_setup
from inference.tool_calls.template import prompt_render, template_messages
from tenants.models import Tier
from tokenization.tokenizer import load_tokenizer


@dataclass(slots=True)
class PreparedPrompt:
    prompt_token_ids: list[int]
    # gpuworkers.engine.SamplingParams fields, as plain JSON values.
    sampling: dict[str, Any]
    # inference.tool_calls.ToolParsing.to_dict(); None: no tool calls to read.
    tool_parsing: dict[str, Any] | None = None


# What an endpoint hands completion_start to turn its (screened) request
# into prompt tokens and sampling settings: chat_prompt_prepare for chat and
# the Responses API, a raw-text one for /v1/completions.
PromptPreparer = Callable[..., "PreparedPrompt"]


def chat_prompt_prepare(
    *,
    request: ChatCompletionRequest,
    model: ServedModel,
    tier: Tier,
    default_max_tokens: int | None = None,
) -> PreparedPrompt:
    """Render and tokenize the prompt and bound the completion, before any GPU work.

    The context cap is the smaller of the tier's and the model's; a prompt
    plus max_tokens over it is a 400 ``context_length_exceeded``. Without a
    max_tokens the completion may use the tier's output cap (or the caller's
    ``default_max_tokens``, when smaller) or whatever
    context remains, whichever is smaller.
    """
    tokenizer = load_tokenizer(str(served_model_dir(model=model)))
    tools = tool_setup(request)
    messages = template_messages(request.messages)
    try:
        prompt_ids = prompt_render(
            tokenizer, messages, tools=tools.template_tools, model=model.name
        )
    except (jinja2.TemplateError, ValueError) as exc:
        raise InvalidRequest(
            f"The messages cannot be rendered with this model's chat template: {exc}",
            param="messages",
        ) from exc
    max_tokens = output_bound(
        prompt_tokens=len(prompt_ids),
        request=request,
        model=model,
        tier=tier,
        default_max_tokens=default_max_tokens,
    )
    sampling = sampling_for(
        request, max_tokens, len(tokenizer), structured_output=tools.structured_output
    )
    parsing = tools.parsing.to_dict() if tools.parsing is not None else None
    return PreparedPrompt(prompt_token_ids=prompt_ids, sampling=sampling, tool_parsing=parsing)


def output_bound(
    *,
    prompt_tokens: int,
    request: ChatCompletionRequest,
    model: ServedModel,
    tier: Tier,
    default_max_tokens: int | None = None,
) -> int:
    """The completion's max_tokens for a prompt of ``prompt_tokens``, or a 400.

    Shared by every endpoint: the tier's output cap, the context cap (the
    smaller of the tier's and the model's) and the client's own cap.
    """
    limit = min(tier.max_context_tokens, model.context_length)
    param, requested = request.requested_max_tokens
    if requested is not None and requested > tier.max_output_tokens:
        raise InvalidRequest(
            f"{param} is too large: {requested}. This model supports at most "
            f"{tier.max_output_tokens} completion tokens on the {tier.name} tier.",
            param=param,
            code="integer_above_max_value",
        )
    output_cap = min(tier.max_output_tokens, default_max_tokens or tier.max_output_tokens)
    max_tokens = requested or min(output_cap, limit - prompt_tokens)
    if prompt_tokens + max(max_tokens, 1) > limit:
        raise ContextLengthExceeded(
            f"This model's maximum context length is {limit} tokens. However, you "
            f"requested {prompt_tokens + max(max_tokens, 1)} tokens ({prompt_tokens} in the "
            f"messages, {max(max_tokens, 1)} in the completion). Please reduce the length "
            "of the messages or completion."
        )
    return max_tokens
