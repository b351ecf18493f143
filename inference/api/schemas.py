"""Request and response schemas of the OpenAI-compatible API.

Requests are validated strictly and reject unknown fields: a parameter the
platform does not know gets a 400 naming it. Every field of OpenAI's own
request bodies is known: honoured, or accepted and ignored where it has
no meaning here (README, "API compatibility"). No string anywhere in a
body may hold what the stores cannot (``inference.storable``).
Tool calling (tools, tool_choice, parallel_tool_calls, tool messages) is
``inference.tool_calls``. Besides OpenAI's own sampling parameters the
request takes vLLM's extra ones (top_k, min_p, repetition_penalty,
min_tokens, ignore_eos, stop_token_ids, bad_words, include_stop_str_in_output,
skip_special_tokens, prompt_logprobs) with vLLM's meaning, and
``deterministic`` (ours: bitwise-reproducible output).
Responses mirror OpenAI's ``chat.completion`` and ``chat.completion.chunk``;
the endpoints build them as dicts on the hot path and these classes document
them in the OpenAPI schema.
"""

from typing import Annotated, Any, Literal

from ninja import Schema
from pydantic import AfterValidator, ConfigDict, Field, field_validator, model_validator

from inference.errors import InvalidRequest
from inference.storable import first_unstorable, unstorable_reason
from inference.tool_calls.checks import messages_check, tools_check
from inference.tool_calls.schema_guard import schema_shape_check
from inference.tool_calls.schemas import (
    MAX_TOOLS,
    FunctionDefinition,
    FunctionName,
    NamedToolChoice,
    ToolCall,
    ToolCallFunction,
    ToolChoice,
    ToolDefinition,
)
from sampling_rules.limits import (
    LOGIT_BIAS_RANGE,
    MAX_BAD_WORD_CHARS,
    MAX_BAD_WORDS,
    MAX_LOGIT_BIAS,
    MAX_N,
    MAX_PROMPT_LOGPROBS,
    MAX_STOP_STRING_CHARS,
    MAX_STOP_STRINGS,
    MAX_STOP_TOKEN_IDS,
    MAX_TOP_LOGPROBS,
)

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1


def _encodable(value: str) -> str:
    # JSON escapes can spell unpaired UTF-16 surrogates ("\ud800") and NUL:
    # valid JSON, but neither the tokenizer nor PostgreSQL takes them.
    reason = unstorable_reason(value)
    if reason is not None:
        raise ValueError(reason.replace("it ", "the string ", 1))
    return value


ENCODABLE = AfterValidator(_encodable)
Text = Annotated[str, ENCODABLE]


class StrictSchema(Schema):
    # strict: "2" is not an integer and "true" not a boolean, as with OpenAI.
    model_config = ConfigDict(extra="forbid", strict=True)


class RequestBody(StrictSchema):
    """A whole request body: no string in it, key or value, at any depth,
    may hold NUL or an unpaired surrogate (``inference.storable``)."""

    @model_validator(mode="before")
    @classmethod
    def _storable(cls, data: Any) -> Any:
        # Before the fields: a NUL in ``model`` must never reach a lookup,
        # nor one in an ignored field a log line or a safety event.
        found = first_unstorable(data)
        if found is not None:
            param, reason = found
            where = f"'{param}'" if param else "the request body"
            raise InvalidRequest(f"Invalid value for {where}: {reason}.", param=param or None)
        return data


class TextContentPart(StrictSchema):
    type: Literal["text"]
    text: Text


class ChatMessage(StrictSchema):
    # "function": the deprecated function-calling API's result message.
    role: Literal["system", "developer", "user", "assistant", "tool", "function"]
    # Required except on an assistant message with tool_calls (checked by
    # inference.tool_calls.checks.messages_check, which knows the index).
    content: Text | Annotated[list[TextContentPart], Field(min_length=1)] | None = None
    name: Annotated[str, Field(max_length=256), ENCODABLE] | None = None
    tool_calls: Annotated[list[ToolCall], Field(min_length=1)] | None = None
    tool_call_id: Annotated[str, Field(min_length=1, max_length=256), ENCODABLE] | None = None
    # An earlier assistant message sent back as the API returned it: its
    # refusal and audio are accepted and ignored, a legacy function_call is
    # a tool call (legacy_message_map).
    refusal: Text | None = None
    audio: dict[str, Any] | None = None
    function_call: ToolCallFunction | None = None

    @model_validator(mode="after")
    def _legacy_function_calling(self) -> "ChatMessage":
        legacy_message_map(self)
        return self

    @property
    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "\n".join(part.text for part in self.content)


class StreamOptions(StrictSchema):
    include_usage: bool | None = None


class JsonSchemaFormat(StrictSchema):
    """OpenAI's ``response_format.json_schema``."""

    # OpenAI's rule for the name: letters, digits, underscores and dashes.
    name: Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_-]+$")]
    description: Text | None = None
    # Any JSON Schema object (the grammar compiler judges it); absent: any
    # JSON value. Aliased: a field named "schema" shadows BaseModel.schema().
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: bool | None = None


class ResponseFormat(StrictSchema):
    """OpenAI's ``response_format``: plain text, any JSON object, or JSON
    matching a schema; the engine enforces the last two by grammar."""

    type: Literal["text", "json_object", "json_schema"]
    # Aliased: ninja's Schema has a json_schema() of its own.
    json_schema_: JsonSchemaFormat | None = Field(default=None, alias="json_schema")

    @model_validator(mode="after")
    def _schema_iff_json_schema(self) -> "ResponseFormat":
        if (self.type == "json_schema") != (self.json_schema_ is not None):
            raise InvalidRequest(
                "response_format.json_schema is required when type is 'json_schema', "
                "and allowed only then.",
                param="response_format",
            )
        schema = self.json_schema_.schema_ if self.json_schema_ is not None else None
        if schema is not None:
            # Compiled later by the grammar compiler, off the event loop;
            # here only what it must never be asked (a fetch, unbounded work).
            schema_shape_check(schema, param="response_format", what="response_format")
        return self

    def structured_output(self) -> dict[str, Any] | None:
        """The engine's ``structured_output`` for this format (None: text)."""
        if self.type == "text":
            return None
        if self.type == "json_object":
            return {"type": "json_object"}
        found = self.json_schema_
        schema = {} if found.schema_ is None else found.schema_
        return {"type": "json_schema", "schema": schema, "strict": bool(found.strict)}


# Stop strings are matched against the output after every token; a huge one
# would be held back and compared at every step for nothing.
StopString = Annotated[str, Field(min_length=1, max_length=MAX_STOP_STRING_CHARS), ENCODABLE]
BadWord = Annotated[str, Field(min_length=1, max_length=MAX_BAD_WORD_CHARS), ENCODABLE]
Penalty = Annotated[float, Field(ge=-2, le=2)]
TokenId = Annotated[int, Field(ge=0, le=2**31 - 1)]
Bias = Annotated[float, Field(ge=-LOGIT_BIAS_RANGE, le=LOGIT_BIAS_RANGE)]


# OpenAI's metadata: at most 16 pairs, keys of 64 characters, values of 512.
Metadata = Annotated[
    dict[Annotated[str, Field(max_length=64)], Annotated[str, Field(max_length=512)]],
    Field(max_length=16),
]
# What OpenAI's clients send and this server accepts but does not act on
# (README, "API compatibility"): objects it does not look into.
IgnoredObject = dict[str, Any]
LegacyFunctionCall = Literal["none", "auto"] | FunctionName


class ChatCompletionRequest(RequestBody):
    model: Annotated[str, Field(min_length=1, max_length=128), ENCODABLE]
    messages: Annotated[list[ChatMessage], Field(min_length=1)]
    max_tokens: Annotated[int, Field(ge=1)] | None = None
    max_completion_tokens: Annotated[int, Field(ge=1)] | None = None
    temperature: Annotated[float, Field(ge=0, le=2)] | None = None
    top_p: Annotated[float, Field(ge=0, le=1)] | None = None
    n: Annotated[int, Field(ge=1, le=MAX_N)] | None = None
    stop: StopString | Annotated[list[StopString], Field(max_length=MAX_STOP_STRINGS)] | None = None
    seed: Annotated[int, Field(ge=INT64_MIN, le=INT64_MAX)] | None = None
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    logprobs: bool | None = None
    top_logprobs: Annotated[int, Field(ge=0, le=MAX_TOP_LOGPROBS)] | None = None
    user: Annotated[str, Field(max_length=256), ENCODABLE] | None = None
    presence_penalty: Penalty | None = None
    frequency_penalty: Penalty | None = None
    # Token id (a string, as JSON keys are) -> bias added to its logit.
    logit_bias: Annotated[dict[str, Bias], Field(max_length=MAX_LOGIT_BIAS)] | None = None
    # vLLM's extra sampling parameters.
    top_k: Annotated[int, Field(ge=-1, le=2**31 - 1)] | None = None
    min_p: Annotated[float, Field(ge=0, le=1)] | None = None
    repetition_penalty: Annotated[float, Field(gt=0, le=2)] | None = None
    min_tokens: Annotated[int, Field(ge=0)] | None = None
    ignore_eos: bool | None = None
    stop_token_ids: Annotated[list[TokenId], Field(max_length=MAX_STOP_TOKEN_IDS)] | None = None
    bad_words: Annotated[list[BadWord], Field(max_length=MAX_BAD_WORDS)] | None = None
    include_stop_str_in_output: bool | None = None
    skip_special_tokens: bool | None = None
    prompt_logprobs: Annotated[int, Field(ge=0, le=MAX_PROMPT_LOGPROBS)] | None = None
    # Ours: bitwise the same tokens and logprobs for the same request
    # whatever else is batched or cached with it (README, "Determinism").
    deterministic: bool | None = None
    tools: Annotated[list[ToolDefinition], Field(min_length=1, max_length=MAX_TOOLS)] | None = None
    tool_choice: ToolChoice | None = None
    parallel_tool_calls: bool | None = None
    response_format: ResponseFormat | None = None
    # OpenAI's fields that are honoured another way: legacy functions as
    # tools; prompt_cache_key as the routing conversation (fleet.routing);
    # safety_identifier, which replaces user, as user; every service tier
    # is served as "default".
    functions: (
        Annotated[list[FunctionDefinition], Field(min_length=1, max_length=MAX_TOOLS)] | None
    ) = None
    function_call: LegacyFunctionCall | None = None
    prompt_cache_key: Annotated[str, Field(max_length=256)] | None = None
    safety_identifier: Annotated[str, Field(max_length=256)] | None = None
    service_tier: Literal["auto", "default", "flex", "scale", "priority", "fast"] | None = None
    # Only text comes out of these models: ["text"] is the one honoured value.
    modalities: list[Literal["text", "audio"]] | None = None
    # Accepted and ignored: nothing is stored, no reasoning or search model
    # is served, moderation follows the tenant's policy (README table).
    metadata: Metadata | None = None
    store: bool | None = None
    prompt_cache_retention: Literal["in_memory", "24h"] | None = None
    prompt_cache_options: IgnoredObject | None = None
    reasoning_effort: Literal["none", "minimal", "low", "medium", "high", "xhigh", "max"] | None = (
        None
    )
    verbosity: Literal["low", "medium", "high"] | None = None
    audio: IgnoredObject | None = None
    prediction: IgnoredObject | None = None
    web_search_options: IgnoredObject | None = None
    moderation: IgnoredObject | None = None

    @field_validator("logit_bias")
    @classmethod
    def _token_id_keys(cls, value: dict[str, float] | None) -> dict[str, float] | None:
        for key in value or {}:
            if not key.isdigit() or int(key) > 2**31 - 1:
                raise ValueError(
                    f"logit_bias keys must be token ids (non-negative integers): {key!r}"
                )
        return value

    # Cross-field rules raise InvalidRequest (not ValueError) so the 400
    # names the param; a model-level ValueError would carry no field.
    @model_validator(mode="after")
    def _cross_field_rules(self) -> "ChatCompletionRequest":
        messages_check(self.messages)
        legacy_functions_map(self)
        if self.modalities is not None and "audio" in self.modalities:
            raise InvalidRequest(
                'Audio output is not supported by this server; use modalities ["text"].',
                param="modalities",
                code="unsupported_value",
            )
        tools_check(self)
        if self.top_logprobs and not self.logprobs:
            raise InvalidRequest("top_logprobs requires logprobs to be true.", param="top_logprobs")
        stream_rules_check(self)
        if (
            self.max_tokens is not None
            and self.max_completion_tokens is not None
            and self.max_tokens != self.max_completion_tokens
        ):
            raise InvalidRequest(
                "Set either max_tokens or max_completion_tokens, not both.",
                param="max_tokens",
            )
        return self

    @property
    def requested_max_tokens(self) -> tuple[str, int | None]:
        """(param name, value) of whichever output cap the client set."""
        if self.max_completion_tokens is not None:
            return "max_completion_tokens", self.max_completion_tokens
        return "max_tokens", self.max_tokens

    @property
    def include_usage(self) -> bool:
        return bool(self.stream and self.stream_options and self.stream_options.include_usage)


def legacy_call_id(name: str) -> str:
    # The legacy API had no call ids: a call and its result pair by name.
    return f"call_legacy_{name}"


def legacy_message_map(message: ChatMessage) -> None:
    """A deprecated function-calling turn as the tool-calling one it was."""
    if message.function_call is not None:
        if message.role != "assistant" or message.tool_calls is not None:
            raise ValueError(
                "function_call is only allowed on assistant messages without tool_calls"
            )
        call = message.function_call
        message.tool_calls = [
            ToolCall(id=legacy_call_id(call.name), type="function", function=call)
        ]
        message.function_call = None
    if message.role == "function":
        if not message.name:
            raise ValueError("a function message needs the name of the function")
        message.role, message.tool_call_id = "tool", legacy_call_id(message.name)


def legacy_functions_map(request: ChatCompletionRequest) -> None:
    """OpenAI's deprecated ``functions`` / ``function_call`` as ``tools`` /
    ``tool_choice`` (calls are answered as ``tool_calls``, one per reply,
    as the legacy API made at most one)."""
    if request.functions is None:
        if request.function_call is not None:
            raise InvalidRequest(
                "Invalid value for 'function_call': 'function_call' is only allowed when "
                "'functions' are specified.",
                param="function_call",
            )
        return
    if request.tools is not None or request.tool_choice is not None:
        raise InvalidRequest(
            "Use either 'functions' (deprecated) or 'tools', not both.", param="functions"
        )
    request.tools = [ToolDefinition(type="function", function=f) for f in request.functions]
    choice = request.function_call
    if isinstance(choice, FunctionName):
        names = [f.name for f in request.functions]
        if choice.name not in names:
            raise InvalidRequest(
                f"Invalid value for 'function_call': no function named '{choice.name}' "
                "is in 'functions'.",
                param="function_call",
            )
        choice = NamedToolChoice(type="function", function=choice)
    request.tool_choice = choice
    request.parallel_tool_calls = False


def stream_rules_check(request: Any) -> None:
    """What streaming rules out, for chat and completions alike."""
    if request.prompt_logprobs is not None and request.stream:
        # As vLLM: prompt logprobs come whole with the response, never
        # streamed (a stream's first chunk must not wait for them).
        raise InvalidRequest(
            "prompt_logprobs is not available when stream is true.", param="prompt_logprobs"
        )
    if request.stream_options is not None and not request.stream:
        raise InvalidRequest(
            "The 'stream_options' parameter is only allowed when 'stream' is enabled.",
            param="stream_options",
        )


# Responses (documentation; built as plain dicts by inference.relay.tap).


class TopLogprob(Schema):
    token: str
    logprob: float
    bytes: list[int] | None = None


class TokenLogprob(TopLogprob):
    top_logprobs: list[TopLogprob]


class ChoiceLogprobs(Schema):
    content: list[TokenLogprob] | None = None
    refusal: list[TokenLogprob] | None = None


class ToolCallFunctionOut(Schema):
    name: str
    # A JSON text (OpenAI's shape), as the model wrote it.
    arguments: str


class ToolCallOut(Schema):
    id: str
    type: Literal["function"]
    function: ToolCallFunctionOut


class AssistantMessage(Schema):
    role: Literal["assistant"]
    # null when the message is only tool calls.
    content: str | None
    refusal: str | None = None
    tool_calls: list[ToolCallOut] | None = None


class Choice(Schema):
    index: int
    message: AssistantMessage
    logprobs: ChoiceLogprobs | None = None
    finish_reason: str | None


class PromptTokensDetails(Schema):
    cached_tokens: int


class Usage(Schema):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails


class PromptLogprob(Schema):
    logprob: float
    rank: int | None = None
    decoded_token: str


class ChatCompletion(Schema):
    id: str
    object: Literal["chat.completion"]
    created: int
    model: str
    system_fingerprint: str | None = None
    choices: list[Choice]
    usage: Usage
    # With the request's prompt_logprobs (vLLM's extra): per prompt token,
    # None for the first, else token id -> its logprob and alternatives'.
    prompt_logprobs: list[dict[str, PromptLogprob] | None] | None = None


class ToolCallFunctionDelta(Schema):
    name: str | None = None
    arguments: str | None = None


class ToolCallDelta(Schema):
    # The call's position in message.tool_calls; id, type and name come on
    # its first delta, argument fragments on the following ones.
    index: int
    id: str | None = None
    type: Literal["function"] | None = None
    function: ToolCallFunctionDelta | None = None


class ChunkDelta(Schema):
    role: Literal["assistant"] | None = None
    content: str | None = None
    tool_calls: list[ToolCallDelta] | None = None


class ChunkChoice(Schema):
    index: int
    delta: ChunkDelta
    logprobs: ChoiceLogprobs | None = None
    finish_reason: str | None


class ChatCompletionChunk(Schema):
    id: str
    object: Literal["chat.completion.chunk"]
    created: int
    model: str
    system_fingerprint: str | None = None
    choices: list[ChunkChoice]
    usage: Usage | None = None


class ModelObject(Schema):
    id: str
    object: Literal["model"]
    created: int
    owned_by: str
    max_model_len: int
    features: list[str]


class ModelList(Schema):
    object: Literal["list"]
    data: list[ModelObject]


class ErrorBody(Schema):
    message: str
    type: str
    param: str | None
    code: str | None


class ErrorResponse(Schema):
    error: ErrorBody
