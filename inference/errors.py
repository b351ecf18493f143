"""Typed API errors, and the one place that maps every failure to OpenAI's shape.

Every error the API returns is ``{"error": {"message", "type", "param",
"code"}}`` with a matching HTTP status, so the official SDKs raise their typed
exceptions (BadRequestError with ``.param``, AuthenticationError, ...).
Endpoints and services raise the classes below; ``install_error_handlers``
turns them, ninja's own errors and anything unexpected into responses.
"""

from __future__ import annotations

import logging
import math
from typing import Any

from django.core.exceptions import RequestDataTooBig
from django.http import Http404, HttpRequest, HttpResponse
from ninja import NinjaAPI
from ninja.errors import AuthenticationError as NinjaAuthenticationError
from ninja.errors import HttpError
from ninja.errors import ValidationError as NinjaValidationError

logger = logging.getLogger(__name__)


class APIError(Exception):
    """Base class: an error with an HTTP status and OpenAI's error fields.

    Deliberately not a ValueError, so raising one inside a pydantic validator
    propagates as-is instead of being folded into a ValidationError.
    """

    status = 500
    type = "server_error"
    code: str | None = None
    default_message = "The server had an error while processing your request."

    def __init__(
        self,
        message: str | None = None,
        *,
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ):
        self.message = message or self.default_message
        self.param = param
        if code is not None:
            self.code = code
        self.headers = dict(headers or {})
        super().__init__(self.message)

    def payload(self) -> dict[str, Any]:
        return error_payload(self.message, self.type, self.param, self.code)


class InvalidRequest(APIError):
    status = 400
    type = "invalid_request_error"
    code = "invalid_value"


class ContextLengthExceeded(InvalidRequest):
    code = "context_length_exceeded"

    def __init__(self, message: str, *, limit: int | None = None, prompt_tokens: int | None = None):
        super().__init__(message, param="messages")
        # For callers that word it for people (the console) rather than for code.
        self.limit = limit
        self.prompt_tokens = prompt_tokens


class ContentPolicyViolation(InvalidRequest):
    """A prompt the tenant's safety policy refuses (safety/), before any GPU work."""

    code = "content_policy_violation"
    default_message = (
        "Your request was rejected as a result of our safety system. Your prompt may "
        "contain text that is not allowed by the safety policy of your organization."
    )

    def __init__(self, message: str | None = None):
        super().__init__(message, param="messages")


class RequestTooLarge(InvalidRequest):
    status = 413
    code = "request_too_large"


class AuthenticationFailed(APIError):
    status = 401
    # OpenAI reports bad keys as invalid_request_error with this code.
    type = "invalid_request_error"
    code = "invalid_api_key"
    default_message = (
        "Incorrect or missing API key. Provide it in an Authorization header "
        "using Bearer auth (Authorization: Bearer YOUR_KEY)."
    )


class PermissionDenied(APIError):
    status = 403
    type = "permission_error"
    code = "permission_denied"
    default_message = "You are not allowed to make this request."


class NotFound(APIError):
    status = 404
    type = "invalid_request_error"
    code = "not_found"
    default_message = "Not found."


class ModelNotFound(NotFound):
    code = "model_not_found"

    def __init__(self, model: str):
        # Same answer for unknown and tier-restricted models: a key must not
        # learn which models other tiers have.
        super().__init__(
            f"The model `{model}` does not exist or you do not have access to it.",
            param="model",
        )


class MethodNotAllowed(APIError):
    status = 405
    type = "invalid_request_error"
    code = "method_not_allowed"


class RateLimited(APIError):
    status = 429
    type = "requests"
    code = "rate_limit_exceeded"
    default_message = "Rate limit reached. Retry after the time in the Retry-After header."

    def __init__(self, message: str | None = None, *, retry_after: float, **kwargs: Any):
        super().__init__(message, **kwargs)
        self.retry_after = max(0.0, retry_after)
        self.headers.setdefault("Retry-After", str(math.ceil(self.retry_after)))
        self.headers.setdefault("retry-after-ms", str(math.ceil(self.retry_after * 1000)))


class InsufficientQuota(APIError):
    status = 429
    type = "insufficient_quota"
    code = "insufficient_quota"
    default_message = "You exceeded your current monthly token quota."


# --- Rate limits and quotas (issue 5) ---
_RATE_LIMIT_MESSAGES = {
    "requests": "Rate limit reached for requests per minute (RPM): Limit {limit}, "
    "Remaining {remaining}, Requested 1. Please try again in {reset}.",
    "tokens": "Rate limit reached for tokens per minute (TPM): Limit {limit}, "
    "Remaining {remaining}, Requested {tokens}. Please try again in {reset}.",
    "concurrency": "Too many concurrent requests for your organization. Please retry "
    "when one of them has finished.",
}


def rate_limit_error(decision: Any, *, tokens: int) -> APIError:
    """The 429 for a refused admission (a ``tenants.ratelimit.Decision``).

    Over the monthly quota is ``insufficient_quota``, which waiting a minute
    does not fix; every other refusal is ``rate_limit_exceeded`` with a
    Retry-After. Both carry the x-ratelimit-* headers.
    """
    from tenants.ratelimit import format_reset

    headers = decision.headers()
    if decision.outcome == "quota":
        return InsufficientQuota(headers=headers)
    by_tokens = decision.outcome == "tokens"
    message = _RATE_LIMIT_MESSAGES[decision.outcome].format(
        limit=decision.limit_tokens if by_tokens else decision.limit_requests,
        remaining=decision.remaining_tokens if by_tokens else decision.remaining_requests,
        tokens=tokens,
        reset=format_reset(decision.retry_after_ms),
    )
    error = RateLimited(message, retry_after=decision.retry_after_ms / 1000, headers=headers)
    if by_tokens:
        # OpenAI's error type names the limit: "requests" or "tokens".
        error.type = "tokens"
    return error


class ServerError(APIError):
    status = 500


class ServiceUnavailable(APIError):
    status = 503
    type = "server_error"
    code = "service_unavailable"
    default_message = "The service is temporarily unavailable. Please retry shortly."

    def __init__(self, message: str | None = None, *, retry_after: float | None = None, **kwargs):
        super().__init__(message, **kwargs)
        # Seconds until a retry can work, when known (Retry-After).
        self.retry_after = retry_after
        if retry_after is not None:
            self.headers.setdefault("Retry-After", str(math.ceil(retry_after)))


def error_payload(
    message: str, type_: str, param: str | None = None, code: str | None = None
) -> dict[str, Any]:
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


def error_response(exc: APIError) -> HttpResponse:
    from django.http import JsonResponse

    response = JsonResponse(exc.payload(), status=exc.status)
    for name, value in exc.headers.items():
        response[name] = value
    return response


def as_api_error(exc: BaseException) -> APIError:
    """Map any exception raised while serving /v1 to an APIError."""
    if isinstance(exc, APIError):
        return exc
    if isinstance(exc, NinjaValidationError):
        return validation_error_to_api_error(exc.errors)
    if isinstance(exc, RequestDataTooBig):
        return RequestTooLarge("The request body is too large.")
    if isinstance(exc, NinjaAuthenticationError):
        return AuthenticationFailed()
    if isinstance(exc, Http404):
        return NotFound()
    if isinstance(exc, HttpError):
        if exc.status_code == 400:
            # ninja's only 400 is an unparsable body (bad JSON or bad UTF-8).
            return InvalidRequest(
                "We could not parse the JSON body of your request. The API "
                "expects a JSON object encoded as UTF-8.",
                code="invalid_json",
            )
        if exc.status_code == 403:
            return PermissionDenied(str(exc))
        if exc.status_code == 404:
            return NotFound(str(exc))
        return APIError(str(exc))
    logger.error("Unhandled error in the API", exc_info=exc)
    return ServerError()


# pydantic error types -> OpenAI error codes.
_CODES = {
    "missing": "missing_required_parameter",
    "extra_forbidden": "unknown_parameter",
    "too_long": "array_above_max_length",
    "too_short": "array_below_min_length",
    "string_too_short": "empty_string",
    "string_too_long": "string_above_max_length",
    "greater_than": "value_below_min_value",
    "greater_than_equal": "value_below_min_value",
    "less_than": "value_above_max_value",
    "less_than_equal": "value_above_max_value",
}
# Leading entries of ninja's loc that name where the value came from.
_LOC_SOURCES = {"body", "query", "path", "header", "cookie", "form", "file"}


def _is_union_tag(part: str) -> bool:
    # pydantic names the union member it tried ("str", "constrained-str",
    # "list[...]", "TextContentPart"); field names here are snake_case.
    return (
        "[" in part or "-" in part or part[:1].isupper() or part in {"str", "int", "float", "bool"}
    )


def _is_type_error(kind: str) -> bool:
    return kind.endswith(("_type", "_parsing"))


def error_param(loc: tuple | list, body_param: str = "payload") -> str | None:
    """OpenAI's param path for a pydantic loc: ``messages[0].role``, ``stop``."""
    parts = list(loc)
    if parts and parts[0] in _LOC_SOURCES:
        parts = parts[1:]
    if parts and parts[0] == body_param:
        parts = parts[1:]
    path = ""
    for part in parts:
        if isinstance(part, int):
            path += f"[{part}]"
        elif _is_union_tag(str(part)):
            break
        else:
            path += f".{part}" if path else str(part)
    return path or None


def validation_error_to_api_error(errors: list[dict[str, Any]]) -> InvalidRequest:
    """The first invalid param as a 400 naming it."""
    param = error_param(errors[0].get("loc", ())) if errors else None
    if param is None:
        return InvalidRequest("The request body must be a JSON object.", code="invalid_json")
    # A union (content: str | list of parts) reports one error per member.
    # A type mismatch only says that member did not apply; among the rest
    # the deepest is the most specific, and equally deep ones are alternatives.
    same = [e for e in errors if error_param(e.get("loc", ())) == param]
    applied = [e for e in same if not _is_type_error(e.get("type", ""))]
    same = applied or same
    depth = max(len(e.get("loc", ())) for e in same)
    deepest = [e for e in same if len(e.get("loc", ())) == depth]
    first = deepest[0]
    kind = first.get("type", "")
    if kind == "missing":
        message = f"Missing required parameter: '{param}'."
    elif kind == "extra_forbidden":
        message = f"Unrecognized request argument supplied: {param}"
    else:
        detail = " or ".join(dict.fromkeys(e.get("msg", "invalid") for e in deepest))
        message = f"Invalid value for '{param}': {detail}."
    code = _CODES.get(kind, "invalid_type" if _is_type_error(kind) else "invalid_value")
    return InvalidRequest(message, param=param, code=code)


def install_error_handlers(api: NinjaAPI) -> None:
    """Route every exception the API sees through ``as_api_error``."""

    def handle(request: HttpRequest, exc: Exception) -> HttpResponse:
        return error_response(as_api_error(exc))

    # ninja picks the most specific registered class along the MRO, so one
    # handler on Exception also replaces its defaults for HttpError & co.
    for exc_class in (Exception, HttpError, NinjaValidationError, Http404, APIError):
        api.add_exception_handler(exc_class, handle)
