"""Schemas of ``POST /v1/moderations`` (OpenAI's moderation object)."""

from typing import Annotated, Literal

from pydantic import Field

from inference.api.schemas import RequestBody, StrictSchema, Text

# OpenAI takes up to 32 inputs a request.
MAX_INPUTS = 32


class TextInput(StrictSchema):
    type: Literal["text"]
    text: Text


class ModerationRequest(RequestBody):
    input: (
        Text
        | Annotated[list[Text], Field(min_length=1, max_length=MAX_INPUTS)]
        | Annotated[list[TextInput], Field(min_length=1, max_length=MAX_INPUTS)]
    )
    model: Annotated[str, Field(min_length=1, max_length=128)] | None = None

    @property
    def texts(self) -> list[str]:
        if isinstance(self.input, str):
            return [self.input]
        return [item if isinstance(item, str) else item.text for item in self.input]


class ModerationResult(StrictSchema):
    flagged: bool
    categories: dict[str, bool]
    category_scores: dict[str, float]
    category_applied_input_types: dict[str, list[str]]


class ModerationResponse(StrictSchema):
    id: str
    model: str
    results: list[ModerationResult]
