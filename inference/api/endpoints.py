"""The OpenAI-compatible endpoints under /v1/.

Each endpoint authenticates (ninja auth), lets ninja validate the body, calls
one service and returns. Errors are raised as inference.errors classes and
mapped to OpenAI's shape in one place (``install_error_handlers``).
"""

from asgiref.sync import sync_to_async
from django.http import HttpRequest
from ninja import Header, NinjaAPI, Router

from fleet.selectors import served_model_get, served_model_list
from inference import moderation, services
from inference.api import completions, sse
from inference.api import responses as responses_api
from inference.api.auth import api_key_auth
from inference.api.capabilities import model_features
from inference.api.chat import chat_request
from inference.api.moderation_schemas import ModerationRequest, ModerationResponse
from inference.api.schemas import (
    ChatCompletion,
    ChatCompletionChunk,
    ChatCompletionRequest,
    ErrorResponse,
    ModelList,
    ModelObject,
)
from inference.errors import ModelNotFound, install_error_handlers
from inference.offload import offloaded
from inference.relay import tap as relay
from inference.storable import unstorable_reason
from wire.tracing import tracer

OWNED_BY = "llm-platform"
ERRORS = {code: ErrorResponse for code in (400, 401, 403, 404, 413, 429, 500, 503)}
STREAM_DOC = {
    "description": "A chat.completion, or with stream=true a text/event-stream of "
    "chat.completion.chunk frames ending in `data: [DONE]`.",
    "responses": {
        200: {
            "content": {
                "text/event-stream": {
                    "schema": {"$ref": "#/components/schemas/ChatCompletionChunk"}
                }
            }
        }
    },
}

RESUME_DOC = {
    "responses": {
        200: {
            "description": "A text/event-stream of chat.completion.chunk frames.",
            "content": {
                "text/event-stream": {
                    "schema": {"$ref": "#/components/schemas/ChatCompletionChunk"}
                }
            },
        }
    }
}


def _stream_doc(description: str) -> dict:
    """OpenAPI for an endpoint answering JSON, or with stream=true SSE frames."""
    return {
        "description": description,
        "responses": {200: {"content": {"text/event-stream": {"schema": {"type": "object"}}}}},
    }


router = Router(auth=api_key_auth)


def _model_object(model) -> dict:
    return {
        "id": model.name,
        "object": "model",
        "created": int(model.created_at.timestamp()),
        "owned_by": OWNED_BY,
        # vLLM's name for the context length; features: inference.api.capabilities.
        "max_model_len": model.context_length,
        "features": model_features(model),
    }


@router.get("/models", response={200: ModelList, **ERRORS}, tags=["models"])
async def list_models(request: HttpRequest):
    """The models this key may use: its tier's, within the key's allow-list."""
    models = await sync_to_async(list)(served_model_list(tier=request.auth.tenant.tier))
    allowed = [m for m in models if request.auth.allows_model(m.name)]
    return {"object": "list", "data": [_model_object(m) for m in allowed]}


@router.get("/models/{path:model_id}", response={200: ModelObject, **ERRORS}, tags=["models"])
async def retrieve_model(request: HttpRequest, model_id: str):
    if unstorable_reason(model_id) is not None:
        # "%00" in the path: no model row can be named so; never a query.
        raise ModelNotFound(model_id.encode("utf-8", "backslashreplace").decode())
    model = await sync_to_async(served_model_get)(name=model_id, tier=request.auth.tenant.tier)
    if model is None or not request.auth.allows_model(model.name):
        raise ModelNotFound(model_id)
    return _model_object(model)


@router.post(
    "/chat/completions",
    response={200: ChatCompletion, **ERRORS},
    tags=["chat"],
    openapi_extra=STREAM_DOC,
)
async def create_chat_completion(request: HttpRequest, payload: ChatCompletionRequest):
    """Create a chat completion; ``stream: true`` answers Server-Sent Events.

    Frames are ``data:`` lines alone; with the request header
    ``X-Stream-Resumable: 1`` each also carries ``id: <seq>`` for a resume.
    """
    # X-Conversation-Id: the routing key's conversation (fleet.routing).
    key = request.auth
    # Compiles the tools' schemas: CPU work, off the event loop.
    with tracer.start_as_current_span("request.build"):
        internal = await offloaded(chat_request)(
            payload, tenant=key.tenant, conversation_id=request.headers.get("X-Conversation-Id")
        )
    tap = await services.generation_start(request=internal, tenant=key.tenant, api_key=key)
    if payload.stream:
        resumable = sse.wants_resumable(request.headers.get(sse.RESUMABLE_HEADER))
        return await sse.stream_response(tap, resumable=resumable)
    return await relay.completion_response(tap)


@router.post(
    "/completions",
    response={200: dict, **ERRORS},
    tags=["completions"],
    openapi_extra=_stream_doc(
        "A text_completion, or with stream=true a text/event-stream of text_completion "
        "frames ending in `data: [DONE]`."
    ),
)
async def create_completion(request: HttpRequest, payload: completions.CompletionRequest):
    """Create a text completion (OpenAI's legacy endpoint); ``stream: true`` answers SSE."""
    return await completions.completions_create(
        api_key=request.auth, request=payload, headers=request.headers
    )


@router.post(
    "/responses",
    response={200: dict, **ERRORS},
    tags=["responses"],
    openapi_extra=_stream_doc(
        "A response object, or with stream=true a text/event-stream of typed events "
        "(`event:` and `data:` lines), response.created through response.completed."
    ),
)
async def create_response(request: HttpRequest, payload: responses_api.ResponsesRequest):
    """Create a model response (OpenAI's Responses API, without server-side storage)."""
    return await responses_api.responses_create(api_key=request.auth, request=payload)


@router.api_operation(
    ["GET", "POST"],
    "/chat/completions/{response_id}/events",
    response={200: ChatCompletionChunk, **ERRORS},
    tags=["chat"],
    openapi_extra=RESUME_DOC,
)
async def resume_chat_completion(
    request: HttpRequest,
    response_id: str,
    last_event_id: str | None = Header(None, alias="Last-Event-ID"),
    after: int | None = None,
):
    """Resume a streamed response after the event ``Last-Event-ID`` (or ``?after=``).

    Frames are those of the original stream after that event, ending in
    `data: [DONE]`; without either, the whole stream from the start. Works
    while the response's events are kept (RESPONSE_STREAM_TTL seconds).
    """
    after_seq = sse.parse_last_event_id(last_event_id) if after is None else max(0, after)
    tap = await services.chat_completion_resume(api_key=request.auth, response_id=response_id)
    return await sse.stream_response(tap, after_seq=after_seq, resumable=True)


@router.post("/moderations", response={200: ModerationResponse, **ERRORS}, tags=["moderations"])
async def create_moderation(request: HttpRequest, payload: ModerationRequest):
    """Classify texts with the checks and the tenant's policy of the chat path (safety/)."""
    await services.moderation_count(api_key=request.auth)
    return await moderation.moderations_create(
        tenant=request.auth.tenant, inputs=payload.texts, model=payload.model
    )


def register(api: NinjaAPI) -> None:
    """Mount the endpoints and the error mapping on the project's API."""
    install_error_handlers(api)
    api.add_router("/", router)
