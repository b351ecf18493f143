"""``/v1/files`` and ``/v1/batches``: OpenAI's Files and Batch API.

Authenticated like every /v1 endpoint (an API key of a tier with API
access); every read and write is scoped to the key's tenant. Errors are
the API's own classes, mapped to OpenAI's shape by inference's handlers.
"""

from __future__ import annotations

from typing import Annotated

from asgiref.sync import sync_to_async
from django.http import HttpRequest, StreamingHttpResponse
from ninja import File as FileParam
from ninja import Form, NinjaAPI, Router
from ninja.files import UploadedFile
from pydantic import Field

from batches import selectors
from batches.schemas import (
    BatchCreateRequest,
    BatchList,
    BatchObject,
    FileDeleted,
    FileList,
    FileObject,
    batch_object,
    file_object,
    page_of,
)
from batches.services import batches as batch_services
from batches.services import files as file_services
from inference.api.auth import api_key_auth
from inference.api.endpoints import ERRORS
from inference.errors import InvalidRequest

router = Router(auth=api_key_auth, tags=["batches"])
CHUNK_BYTES = 256 * 1024
Limit = Annotated[int, Field(ge=1, le=10_000)]


@router.post("/files", response={200: FileObject, **ERRORS}, tags=["files"])
async def create_file(request: HttpRequest, file: FileParam[UploadedFile], purpose: Form[str]):
    """Upload a JSONL file of batch requests (``purpose=batch``)."""
    row = await sync_to_async(file_services.file_upload)(
        tenant=request.auth.tenant,
        purpose=purpose,
        filename=file.name or "upload.jsonl",
        content=file,
        size=file.size,
    )
    return file_object(row)


def query_check(request: HttpRequest, known: set[str]) -> None:
    """A 400 for a query parameter the operation does not define, as for an
    unknown body field: a misspelt ``limit`` silently ignored would page
    wrongly."""
    for name in request.GET:
        if name not in known:
            raise InvalidRequest(
                f"Unrecognized request argument supplied: {name}",
                param=name,
                code="unknown_parameter",
            )


@router.get("/files", response={200: FileList, **ERRORS}, tags=["files"])
async def list_files(
    request: HttpRequest, purpose: str | None = None, after: str | None = None, limit: Limit = 100
):
    query_check(request, {"purpose", "after", "limit", "order"})
    if request.GET.get("order", "desc") != "desc":
        # Newest first, OpenAI's default, is the order the cursor pages in.
        raise InvalidRequest(
            "Only order=desc (newest first) is supported.", param="order", code="invalid_value"
        )
    page = await sync_to_async(selectors.file_list)(
        tenant=request.auth.tenant, purpose=purpose, after=after, limit=limit
    )
    return page_of(page.items, page.has_more, file_object)


@router.get("/files/{file_id}", response={200: FileObject, **ERRORS}, tags=["files"])
async def retrieve_file(request: HttpRequest, file_id: str):
    row = await sync_to_async(selectors.file_get)(tenant=request.auth.tenant, file_id=file_id)
    return file_object(row)


@router.get("/files/{file_id}/content", response={**ERRORS}, tags=["files"])
async def file_content(request: HttpRequest, file_id: str):
    """The file's bytes (an input file, or a batch's output or errors)."""
    row = await sync_to_async(selectors.file_get)(tenant=request.auth.tenant, file_id=file_id)
    handle = await sync_to_async(file_services.file_open)(file=row)
    response = StreamingHttpResponse(_chunks(handle), content_type="application/jsonl")
    response["Content-Length"] = str(row.bytes)
    name = row.filename.replace('"', "")
    response["Content-Disposition"] = f'attachment; filename="{name}"'
    return response


async def _chunks(handle):
    # Read in pool threads: a storage's file (S3 included) is synchronous.
    try:
        while chunk := await sync_to_async(handle.read)(CHUNK_BYTES):
            yield chunk
    finally:
        await sync_to_async(handle.close)()


@router.delete("/files/{file_id}", response={200: FileDeleted, **ERRORS}, tags=["files"])
async def delete_file(request: HttpRequest, file_id: str):
    row = await sync_to_async(selectors.file_get)(tenant=request.auth.tenant, file_id=file_id)
    await sync_to_async(file_services.file_delete)(file=row)
    return {"id": file_id, "object": "file", "deleted": True}


@router.post("/batches", response={200: BatchObject, **ERRORS})
async def create_batch(request: HttpRequest, payload: BatchCreateRequest):
    """Create a batch from an uploaded file; it runs within ``completion_window``."""
    batch = await sync_to_async(batch_services.batch_create)(
        api_key=request.auth,
        input_file_id=payload.input_file_id,
        endpoint=payload.endpoint,
        completion_window=payload.completion_window,
        metadata=payload.metadata,
    )
    return batch_object(batch)


@router.get("/batches", response={200: BatchList, **ERRORS})
async def list_batches(request: HttpRequest, after: str | None = None, limit: Limit = 20):
    query_check(request, {"after", "limit"})
    page = await sync_to_async(selectors.batch_list)(
        tenant=request.auth.tenant, after=after, limit=limit
    )
    return page_of(page.items, page.has_more, batch_object)


@router.get("/batches/{batch_id}", response={200: BatchObject, **ERRORS})
async def retrieve_batch(request: HttpRequest, batch_id: str):
    batch = await sync_to_async(selectors.batch_get)(tenant=request.auth.tenant, batch_id=batch_id)
    return batch_object(batch)


@router.post("/batches/{batch_id}/cancel", response={200: BatchObject, **ERRORS})
async def cancel_batch(request: HttpRequest, batch_id: str):
    """Stop the batch: in-flight lines are aborted, the rest end as error lines."""
    batch = await sync_to_async(batch_services.batch_cancel)(
        tenant=request.auth.tenant, batch_id=batch_id
    )
    return batch_object(batch)


def register(api: NinjaAPI) -> None:
    api.add_router("/", router)
