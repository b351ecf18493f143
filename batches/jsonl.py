"""The batch input file's lines, checked one by one.

Each line is a JSON object ``{custom_id, method, url, body}``: custom_id
unique within the file, method POST, url the batch's endpoint, body valid
for that endpoint by the API's own request schema (the one the endpoint
itself validates with, so a line that passes here is one the endpoint
would accept). Problems are collected, not raised one at a time: the batch
fails with every bad line numbered, in OpenAI's ``errors`` shape.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from inference.api.completions import CompletionRequest
from inference.api.schemas import ChatCompletionRequest
from inference.errors import APIError, validation_error_to_api_error

SCHEMAS = {
    "/v1/chat/completions": ChatCompletionRequest,
    "/v1/completions": CompletionRequest,
}
# A file with more bad lines than this reports the first ones only.
MAX_ERRORS = 100
MAX_CUSTOM_ID = 512


@dataclass(slots=True, frozen=True)
class LineError:
    """One problem of one line (OpenAI's ``BatchError``)."""

    code: str
    message: str
    line: int | None = None
    param: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return {"code": self.code, "message": self.message, "param": self.param, "line": self.line}


@dataclass(slots=True, frozen=True)
class InputLine:
    """A line that passed: what the batch runs."""

    line: int
    custom_id: str
    body: dict[str, Any]


def lines_checked(raw_lines: Iterable[bytes], *, endpoint: str) -> Iterator[InputLine | LineError]:
    """Each line of an input file for a batch on ``endpoint``, checked: the
    line to run, or what is wrong with it (at most MAX_ERRORS problems).

    Streams: only the custom ids seen so far are kept, so a file of any
    size is checked in bounded memory.
    """
    seen: dict[str, int] = {}
    errors = 0
    requests = 0
    for number, raw in enumerate(raw_lines, start=1):
        if not raw.strip():
            continue
        line, problem = _line_check(raw, number, endpoint)
        if problem is None and line.custom_id in seen:
            problem = LineError(
                "duplicate_custom_id",
                f"The custom_id '{line.custom_id}' is already used on line "
                f"{seen[line.custom_id]}; each request needs a unique custom_id.",
                number,
                "custom_id",
            )
        if problem is not None:
            errors += 1
            if errors <= MAX_ERRORS:
                yield problem
            continue
        seen[line.custom_id] = number
        requests += 1
        yield line
    if not requests and not errors:
        yield LineError("empty_file", "The input file contains no requests.")


def _line_check(
    raw: bytes, number: int, endpoint: str
) -> tuple[InputLine | None, LineError | None]:
    def error(code: str, message: str, param: str | None = None):
        return None, LineError(code, message, number, param)

    try:
        data = json.loads(raw)
    except (UnicodeDecodeError, ValueError):
        return error("invalid_json_line", "This line is not parseable as valid JSON.")
    if not isinstance(data, dict):
        return error("invalid_json_line", "Each line must be a JSON object.")
    custom_id = data.get("custom_id")
    if not isinstance(custom_id, str) or not custom_id:
        return error(
            "missing_required_parameter", "custom_id must be a non-empty string.", "custom_id"
        )
    if len(custom_id) > MAX_CUSTOM_ID:
        return error(
            "invalid_value", f"custom_id is longer than {MAX_CUSTOM_ID} characters.", "custom_id"
        )
    if data.get("method") != "POST":
        return error("invalid_method", "The method of each request must be POST.", "method")
    url = data.get("url")
    if url not in SCHEMAS:
        return error(
            "invalid_url",
            f"The url must be one of {', '.join(SCHEMAS)}; got {url!r}.",
            "url",
        )
    if url != endpoint:
        return error(
            "mismatched_url",
            f"The url {url} does not match the batch's endpoint {endpoint}.",
            "url",
        )
    extra = sorted(set(data) - {"custom_id", "method", "url", "body"})
    if extra:
        return error("invalid_request", f"Unrecognized line field: {extra[0]}.", extra[0])
    body = data.get("body")
    if not isinstance(body, dict):
        return error("invalid_request", "body must be a JSON object.", "body")
    if body.get("stream"):
        return error("invalid_value", "Batch requests cannot stream.", "body.stream")
    try:
        SCHEMAS[url].model_validate(body)
    except ValidationError as exc:
        problem = validation_error_to_api_error(exc.errors())
        return error(problem.code or "invalid_request", problem.message, _param(problem))
    except APIError as exc:
        # The schemas' own rules raise the API's 400 directly.
        return error(exc.code or "invalid_request", exc.message, _param(exc))
    return InputLine(number, custom_id, body), None


def _param(exc: APIError) -> str:
    return f"body.{exc.param}" if exc.param else "body"
