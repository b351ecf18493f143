"""Request and response schemas of the OpenAI-compatible API.

Requests are validated strictly and reject unknown fields: a parameter the platform does not implement
(tools, logit_bias, ...) gets a 400 naming it instead of being ignored.
Responses mirror OpenAI's ``chat.completion`` and ``chat.completion.chunk``;
the endpoints build them as dicts on the hot path and these classes document
them in the OpenAPI schema.
"""

from typing import Annotated, Literal

from ninja import Schema
from pydantic import AfterValidator, ConfigDict, Field, field_validator, model_validator

from gpuworkers.engine.sampling_params import MAX_N, MAX_STOP_STRINGS, MAX_TOP_LOGPROBS
from inference.errors import InvalidRequest

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
# Stop strings are matched against the output after every token; a huge one
# would be held back and compared at every step for nothing.
MAX_STOP_STRING_CHARS = 256


def _encodable(value: str) -> str:
    # JSON escapes can spell unpaired UTF-16 surrogates ("\ud800"): valid
    # JSON, but no text. The tokenizer cannot encode them, so refuse here.
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError("the string contains an unpaired surrogate (invalid Unicode)") from None
    return value


ENCODABLE = AfterValidator(_encodable)
Text = Annotated[str, ENCODABLE]


class StrictSchema(Schema):
    # strict: "2" is not an integer and "true" not a boolean, as with OpenAI.
    model_config = ConfigDict(extra="forbid", strict=True)


class TextContentPart(StrictSchema):
    type: Literal["text"]
    text: Text


class ChatMessage(StrictSchema):
    role: Literal["system", "developer", "user", "assistant"]
    content: Text | Annotated[list[TextContentPart], Field(min_length=1)]
    name: Annotated[str, Field(max_length=256), ENCODABLE] | None = None

    @property
    def text(self) -> str:
        if isinstance(self.content, str):
            return self.content
        return "\n".join(part.text for part in self.content)


class StreamOptions(StrictSchema):
    include_usage: bool | None = None


StopString = Annotated[str, Field(min_length=1, max_length=MAX_STOP_STRING_CHARS), ENCODABLE]
UnsupportedPenalty = Annotated[
    float,
    Field(
        description="Accepted for compatibility; only 0 is supported.",
        json_schema_extra={"minimum": 0, "maximum": 0},
    ),
]


class ChatCompletionRequest(StrictSchema):
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
    presence_penalty: UnsupportedPenalty | None = None
    frequency_penalty: UnsupportedPenalty | None = None

    @field_validator("presence_penalty", "frequency_penalty")
    @classmethod
    def _only_zero_penalty(cls, value: float | None) -> float | None:
        if value:
            raise ValueError("only 0 is supported by this platform")
        return value

    # Cross-field rules raise InvalidRequest (not ValueError) so the 400
    # names the param; a model-level ValueError would carry no field.
    @model_validator(mode="after")
    def _cross_field_rules(self) -> "ChatCompletionRequest":
        if self.top_logprobs and not self.logprobs:
            raise InvalidRequest("top_logprobs requires logprobs to be true.", param="top_logprobs")
        if self.stream_options is not None and not self.stream:
            raise InvalidRequest(
                "The 'stream_options' parameter is only allowed when 'stream' is enabled.",
                param="stream_options",
            )
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
    def stop_list(self) -> list[str]:
        if self.stop is None:
            return []
        return [self.stop] if isinstance(self.stop, str) else list(self.stop)

    @property
    def include_usage(self) -> bool:
        return bool(self.stream and self.stream_options and self.stream_options.include_usage)


# Responses (documentation; built as plain dicts by inference.relay).


class TopLogprob(Schema):
    token: str
    logprob: float
    bytes: list[int] | None = None


class TokenLogprob(TopLogprob):
    top_logprobs: list[TopLogprob]


class ChoiceLogprobs(Schema):
    content: list[TokenLogprob] | None = None
    refusal: list[TokenLogprob] | None = None


class AssistantMessage(Schema):
    role: Literal["assistant"]
    content: str | None
    refusal: str | None = None


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


class ChatCompletion(Schema):
    id: str
    object: Literal["chat.completion"]
    created: int
    model: str
    system_fingerprint: str | None = None
    choices: list[Choice]
    usage: Usage


class ChunkDelta(Schema):
    role: Literal["assistant"] | None = None
    content: str | None = None


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
