"""``/v1/chat/completions``: the chat schema -> the internal request.

``chat_request`` is where a ``ChatCompletionRequest`` stops: its messages
become chat turns, its tools and tool_choice the prompt's tools and the
reader of tool calls (``inference.tool_calls``), its sampling parameters
the wire's ``Sampling`` (``sampling_of``, shared with ``/v1/completions``).
"""

from __future__ import annotations

from typing import Any

from inference.api.schemas import ChatCompletionRequest, ChatMessage
from inference.errors import InvalidRequest
from inference.request import ChatPrompt, ChatTurn, InferenceRequest, ToolCallRef, new_response_id
from inference.tool_calls.checks import tools_compile
from inference.tool_calls.setup import tool_setup
from tenants.models import Tenant
from wire.sampling import Sampling
from wire.tracing import TraceContext


def chat_request(
    payload: ChatCompletionRequest, *, tenant: Tenant, conversation_id: str | None = None
) -> InferenceRequest:
    """The internal request for a chat completion of ``tenant``'s.

    Compiles the tools' schemas (CPU work): call it in a worker thread.
    """
    tools_compile(payload.tools)
    tools = tool_setup(payload)
    from_format = payload.response_format.structured_output() if payload.response_format else None
    if tools.structured_output is not None and from_format is not None:
        raise InvalidRequest(
            "response_format cannot be combined with tool_choice 'required' or a named "
            "function: both constrain the whole reply.",
            param="response_format",
        )
    param, max_tokens = payload.requested_max_tokens
    sampling = sampling_of(
        payload,
        max_tokens=max_tokens,
        logprobs=bool(payload.logprobs),
        top_logprobs=payload.top_logprobs or 0,
        prompt_logprobs=payload.prompt_logprobs,
        structured_output=tools.structured_output or from_format,
    )
    prompt = ChatPrompt(
        turns=tuple(chat_turn(m) for m in payload.messages),
        template_tools=tools.template_tools,
        tool_parsing=tools.parsing,
        constrained_by_tools=tools.structured_output is not None,
    )
    return InferenceRequest(
        model=payload.model,
        prompt=prompt,
        sampling=sampling,
        tenant_id=tenant.pk,
        tier=tenant.tier.name,
        response_id=new_response_id("chatcmpl"),
        trace=TraceContext.current(),
        max_tokens_param=param,
        # The header names the conversation; OpenAI's prompt_cache_key is
        # its in-body equivalent (both route to the replica with its prefix).
        conversation_id=conversation_id or payload.prompt_cache_key,
        user=payload.user or payload.safety_identifier,
        include_usage=payload.include_usage,
    )


def chat_turn(message: ChatMessage) -> ChatTurn:
    calls = tuple(
        ToolCallRef(call.id, call.function.name, call.function.arguments)
        for call in message.tool_calls or ()
    )
    return ChatTurn(message.role, message.text, calls, message.tool_call_id)


def sampling_of(
    payload: Any,
    *,
    max_tokens: int | None,
    logprobs: bool,
    top_logprobs: int,
    prompt_logprobs: int | None,
    structured_output: dict[str, Any] | None = None,
) -> Sampling:
    """The sampling parameters chat and completions share, from either's
    schema (OpenAI's names plus vLLM's extras) onto the wire's record."""
    temperature = 1.0 if payload.temperature is None else payload.temperature
    top_p = 1.0 if payload.top_p is None else payload.top_p
    if top_p == 0:
        # The nucleus always keeps the most likely token, so top_p -> 0 is
        # greedy decoding; the engine wants top_p in (0, 1].
        temperature, top_p = 0.0, 1.0
    return Sampling(
        max_tokens=max_tokens,
        temperature=temperature,
        top_p=top_p,
        # vLLM and the API say -1 for "off"; the engine says 0.
        top_k=max(payload.top_k or 0, 0),
        min_p=payload.min_p or 0.0,
        presence_penalty=payload.presence_penalty or 0.0,
        frequency_penalty=payload.frequency_penalty or 0.0,
        repetition_penalty=payload.repetition_penalty or 1.0,
        logit_bias={int(k): float(v) for k, v in (payload.logit_bias or {}).items()},
        min_tokens=payload.min_tokens or 0,
        seed=payload.seed,
        n=payload.n or 1,
        stop=(payload.stop,) if isinstance(payload.stop, str) else tuple(payload.stop or ()),
        stop_token_ids=tuple(payload.stop_token_ids or ()),
        ignore_eos=bool(payload.ignore_eos),
        bad_words=tuple(payload.bad_words or ()),
        include_stop_str_in_output=bool(payload.include_stop_str_in_output),
        skip_special_tokens=payload.skip_special_tokens is not False,
        logprobs=logprobs,
        top_logprobs=top_logprobs,
        prompt_logprobs=prompt_logprobs,
        deterministic=bool(payload.deterministic),
        structured_output=structured_output,
    )
