"""Request ids on every response, and OpenAI-shaped errors for all of /v1/.

A sane incoming ``X-Request-ID`` (from a proxy or the client) is echoed so
logs on both sides join up; anything else gets a fresh id. The id is kept on
``request.request_id`` and bound to the request's log context
(``wire.logs``), so every log line and span of the request carries it.

Errors the API's own handlers never see (no route matched, a method the
route does not accept) are produced by Django and ninja as HTML or plain
text; ``ApiErrorFallbackMiddleware`` rewrites those under /v1/.
"""

import re
import uuid

from asgiref.sync import iscoroutinefunction, markcoroutinefunction
from django.http import HttpRequest, HttpResponseBase

from inference.errors import MethodNotAllowed, NotFound, ServerError, error_response
from wire import logs

REQUEST_ID_HEADER = "x-request-id"
# Echoing arbitrary bytes into a response header invites header injection
# and log forging; accept only short ids made of safe characters.
_SANE_ID = re.compile(r"^[A-Za-z0-9._:\-]{1,128}$")


def new_request_id() -> str:
    return f"req_{uuid.uuid4().hex}"


def request_id_for(request: HttpRequest) -> str:
    incoming = request.headers.get(REQUEST_ID_HEADER, "")
    return incoming if _SANE_ID.match(incoming) else new_request_id()


class ResponseMiddleware:
    """Runs ``before`` on the request and ``after`` on the response, sync or async.

    Under ASGI the whole chain is async; staying async avoids a thread hop
    per request and keeps streaming responses on the event loop.
    """

    sync_capable = True
    async_capable = True

    def __init__(self, get_response):
        self.get_response = get_response
        if iscoroutinefunction(self.get_response):
            markcoroutinefunction(self)

    def __call__(self, request: HttpRequest):
        if iscoroutinefunction(self):
            return self.__acall__(request)
        self.before(request)
        return self.after(request, self.get_response(request))

    async def __acall__(self, request: HttpRequest):
        self.before(request)
        return self.after(request, await self.get_response(request))

    def before(self, request: HttpRequest) -> None:
        pass

    def after(self, request: HttpRequest, response: HttpResponseBase) -> HttpResponseBase:
        return response


class RequestIdMiddleware(ResponseMiddleware):
    """Outermost middleware, so error pages from the inner layers get the id too."""

    def __call__(self, request: HttpRequest):
        response = super().__call__(request)
        if not iscoroutinefunction(self):
            # A sync handler's thread serves other work next: leave it no
            # context (async views bound theirs into it via async_to_sync).
            logs.clear()
        return response

    def before(self, request: HttpRequest) -> None:
        request.request_id = request_id_for(request)
        # A sync server reuses threads: start from a clean context.
        logs.clear()
        logs.bind(request_id=request.request_id)

    def after(self, request: HttpRequest, response: HttpResponseBase) -> HttpResponseBase:
        response[REQUEST_ID_HEADER] = request.request_id
        return response


API_PREFIX = "/v1/"


class ApiErrorFallbackMiddleware(ResponseMiddleware):
    """Non-JSON 404, 405 and 500 responses under /v1/ -> OpenAI's error shape."""

    def after(self, request: HttpRequest, response: HttpResponseBase) -> HttpResponseBase:
        if not request.path.startswith(API_PREFIX) or response.status_code not in (404, 405, 500):
            return response
        if response.get("Content-Type", "").startswith("application/json"):
            return response
        where = f"{request.method} {request.path}"
        if response.status_code == 404:
            error = NotFound(f"Invalid URL ({where})")
        elif response.status_code == 405:
            allowed = response.get("Allow", "")
            error = MethodNotAllowed(f"Method not allowed ({where}); allowed: {allowed}.")
            error.headers["Allow"] = allowed
        else:
            error = ServerError()
        return error_response(error)
