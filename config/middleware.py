"""Web-tier middleware for observability: HTTP metrics and the request's span.

django-prometheus counts requests, responses and latencies by view, method
and status. Its middlewares are ``MiddlewareMixin`` classes, which under
ASGI run every hook through ``sync_to_async``: a thread hop per hook per
request, on a stack whose SSE streams otherwise never leave the event
loop (``inference.middleware``). The classes here call the same hooks
inline (they only touch counters), in sync and async mode alike.

``TracingMiddleware`` opens the request's server span, a child of the
caller's ``traceparent`` if it sent one. Everything the request does runs
under it (dispatch, the bus, the relay task, which inherits the context),
and a streamed response's span ends with its last byte, not with its
headers. Without tracing configured it does nothing.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

from asgiref.sync import iscoroutinefunction
from django.http import HttpRequest, HttpResponseBase
from django_prometheus import middleware as django_prometheus
from opentelemetry.trace import Span, SpanKind, Status, StatusCode, use_span

from inference.middleware import ResponseMiddleware
from wire.tracing import context_from_headers, tracer, tracing_enabled


class PrometheusBeforeMiddleware(ResponseMiddleware):
    """First in MIDDLEWARE: requests and latency including all middleware."""

    def __init__(self, get_response):
        super().__init__(get_response)
        self._hooks = django_prometheus.PrometheusBeforeMiddleware(get_response)

    def before(self, request: HttpRequest) -> None:
        self._hooks.process_request(request)

    def after(self, request: HttpRequest, response: HttpResponseBase) -> HttpResponseBase:
        return self._hooks.process_response(request, response)


class PrometheusAfterMiddleware(ResponseMiddleware):
    """Last in MIDDLEWARE: responses by view, method and status."""

    def __init__(self, get_response):
        super().__init__(get_response)
        self._hooks = django_prometheus.PrometheusAfterMiddleware(get_response)

    def before(self, request: HttpRequest) -> None:
        self._hooks.process_request(request)

    def after(self, request: HttpRequest, response: HttpResponseBase) -> HttpResponseBase:
        # The by-view count of process_view, taken once the URL has resolved.
        if request.resolver_match is not None:
            self._hooks.process_view(request, None)
        return self._hooks.process_response(request, response)


class TracingMiddleware(ResponseMiddleware):
    """The HTTP request's server span; after RequestIdMiddleware (its id)."""

    def __call__(self, request: HttpRequest):
        if iscoroutinefunction(self):
            return self.__acall__(request)
        if not tracing_enabled():
            return self.get_response(request)
        span = self._start(request)
        with use_span(span, end_on_exit=False, record_exception=True):
            try:
                response = self.get_response(request)
            except BaseException:
                span.end()
                raise
        return self._finish(request, response, span)

    async def __acall__(self, request: HttpRequest):
        if not tracing_enabled():
            return await self.get_response(request)
        span = self._start(request)
        with use_span(span, end_on_exit=False, record_exception=True):
            try:
                response = await self.get_response(request)
            except BaseException:
                span.end()
                raise
        return self._finish(request, response, span)

    def _start(self, request: HttpRequest) -> Span:
        return tracer.start_span(
            request.method or "HTTP",
            context=context_from_headers(request.headers),
            kind=SpanKind.SERVER,
            attributes={"http.request.method": request.method or "", "url.path": request.path},
        )

    def _finish(
        self, request: HttpRequest, response: HttpResponseBase, span: Span
    ) -> HttpResponseBase:
        match = request.resolver_match
        if match is not None and match.route:
            route = "/" + match.route.lstrip("/")
            span.update_name(f"{request.method} {route}")
            span.set_attribute("http.route", route)
        span.set_attribute("http.response.status_code", response.status_code)
        if response.status_code >= 500:
            span.set_status(Status(StatusCode.ERROR))
        if getattr(response, "streaming", False) and response.is_async:
            response.streaming_content = _ending_with(response.streaming_content, span)
        else:
            span.end()
        return response


async def _ending_with(content: AsyncIterator[bytes], span: Span) -> AsyncIterator[bytes]:
    """The stream's bytes; ``span`` ends after the last (or on disconnect).

    ``first_chunk`` marks the first body part handed to the server: for SSE
    the first frame a client sees (its time to first token, less the write).
    """
    first = True
    try:
        async for part in content:
            if first:
                first = False
                span.add_event("first_chunk")
            yield part
    finally:
        span.end()
