"""A chat request's sampling parameters as the engine's SamplingParams.

The API speaks OpenAI's names plus vLLM's extras; the engine speaks
vLLM's. This module maps one onto the other and checks what only the
model can judge (token ids against its vocabulary), so a request that
reaches a worker never fails on its sampling settings.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from gpuworkers.engine.sampling_params import InvalidSamplingParams, SamplingParams
from inference.api.schemas import ChatCompletionRequest
from inference.errors import InvalidRequest


def sampling_for(
    request: ChatCompletionRequest,
    max_tokens: int,
    vocab_size: int,
    *,
    structured_output: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The engine's SamplingParams fields for ``request``, as JSON values.

    ``structured_output`` (the engine's JSON Schema constraint, set for
    tool_choice "required" or a named function) is passed through as is.

    Raises InvalidRequest naming the parameter when a value is out of range
    for this model or contradicts another.
    """
    temperature = 1.0 if request.temperature is None else request.temperature
    top_p = 1.0 if request.top_p is None else request.top_p
    if top_p == 0:
        # The nucleus always keeps the most likely token, so top_p -> 0 is
        # greedy decoding; the engine wants top_p in (0, 1].
        temperature, top_p = 0.0, 1.0
    if request.min_tokens and request.min_tokens > max_tokens:
        raise InvalidRequest(
            f"min_tokens ({request.min_tokens}) must be at most max_tokens ({max_tokens}).",
            param="min_tokens",
        )
    logit_bias = {int(k): float(v) for k, v in (request.logit_bias or {}).items()}
    _check_token_ids("logit_bias", logit_bias, vocab_size)
    _check_token_ids("stop_token_ids", request.stop_token_ids or [], vocab_size)
    # The grammar is checked by SamplingParams (the compiler's own validation,
    # about a millisecond, no tokenizer) so a bad schema is a 400 before
    # admission, not a failed stream. It comes from response_format, or from
    # tool_choice "required" or a named function (inference.tool_calls).
    from_format = request.response_format.structured_output() if request.response_format else None
    if structured_output is not None and from_format is not None:
        raise InvalidRequest(
            "response_format cannot be combined with tool_choice 'required' or a named "
            "function: both constrain the whole reply.",
            param="response_format",
        )
    constraint = structured_output if structured_output is not None else from_format
    constraint_param = "response_format" if from_format is not None else "tool_choice"
    try:
        params = SamplingParams(
            max_tokens=max_tokens,
            temperature=temperature,
            top_p=top_p,
            # vLLM and the API say -1 for "off"; the engine says 0.
            top_k=max(request.top_k or 0, 0),
            min_p=request.min_p or 0.0,
            presence_penalty=request.presence_penalty or 0.0,
            frequency_penalty=request.frequency_penalty or 0.0,
            repetition_penalty=request.repetition_penalty or 1.0,
            logit_bias=logit_bias,
            min_tokens=request.min_tokens or 0,
            seed=request.seed,
            n=request.n or 1,
            stop=request.stop_list,
            stop_token_ids=list(request.stop_token_ids or []),
            ignore_eos=bool(request.ignore_eos),
            bad_words=list(request.bad_words or []),
            include_stop_str_in_output=bool(request.include_stop_str_in_output),
            skip_special_tokens=request.skip_special_tokens is not False,
            logprobs=bool(request.logprobs),
            top_logprobs=request.top_logprobs or 0,
            prompt_logprobs=request.prompt_logprobs,
            deterministic=bool(request.deterministic),
            structured_output=constraint,
        )
    except InvalidSamplingParams as exc:
        # The API's name for what the engine calls structured_output.
        param = constraint_param if exc.param == "structured_output" else exc.param
        message = str(exc).replace("structured_output", param, 1)
        raise InvalidRequest(message, param=param) from exc
    sampling = dataclasses.asdict(params)
    # JSON keys are strings: the worker's SamplingParams turns them back.
    sampling["logit_bias"] = {str(k): v for k, v in params.logit_bias.items()}
    return sampling


def _check_token_ids(param: str, token_ids, vocab_size: int) -> None:
    for token_id in token_ids:
        if token_id >= vocab_size:
            raise InvalidRequest(
                f"{param} names token id {token_id}, but this model's vocabulary has "
                f"{vocab_size} tokens (ids 0 to {vocab_size - 1}).",
                param=param,
                code="invalid_value",
            )
