"""The Files and Batch API's JSON: request bodies and OpenAI's objects."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from ninja import Schema
from pydantic import Field

from batches.models import Batch, File
from inference.api.schemas import StrictSchema


class BatchCreateRequest(StrictSchema):
    input_file_id: Annotated[str, Field(min_length=1, max_length=40)]
    endpoint: str
    completion_window: str
    metadata: dict[str, str] | None = None


class FileObject(Schema):
    id: str
    object: Literal["file"] = "file"
    bytes: int
    created_at: int
    filename: str
    purpose: str
    status: str = "processed"
    status_details: str | None = None


class FileList(Schema):
    object: Literal["list"] = "list"
    data: list[FileObject]
    has_more: bool
    first_id: str | None
    last_id: str | None


class FileDeleted(Schema):
    id: str
    object: Literal["file"] = "file"
    deleted: bool


class BatchObject(Schema):
    id: str
    object: Literal["batch"] = "batch"
    endpoint: str
    errors: dict[str, Any] | None
    input_file_id: str
    completion_window: str
    status: str
    output_file_id: str | None
    error_file_id: str | None
    created_at: int
    in_progress_at: int | None
    expires_at: int | None
    finalizing_at: int | None
    completed_at: int | None
    failed_at: int | None
    expired_at: int | None
    cancelling_at: int | None
    cancelled_at: int | None
    request_counts: dict[str, int]
    metadata: dict[str, str] | None


class BatchList(Schema):
    object: Literal["list"] = "list"
    data: list[BatchObject]
    has_more: bool
    first_id: str | None
    last_id: str | None


def _ts(value: datetime | None) -> int | None:
    return int(value.timestamp()) if value is not None else None


def file_object(file: File) -> dict[str, Any]:
    return {
        "id": file.pk,
        "object": "file",
        "bytes": file.bytes,
        "created_at": _ts(file.created_at),
        "filename": file.filename,
        "purpose": file.purpose,
        "status": "processed",
        "status_details": None,
    }


def batch_object(batch: Batch) -> dict[str, Any]:
    return {
        "id": batch.pk,
        "object": "batch",
        "endpoint": batch.endpoint,
        "errors": batch.errors,
        "input_file_id": batch.input_file_id,
        "completion_window": batch.completion_window,
        "status": batch.status,
        "output_file_id": batch.output_file_id,
        "error_file_id": batch.error_file_id,
        "created_at": _ts(batch.created_at),
        "in_progress_at": _ts(batch.in_progress_at),
        "expires_at": _ts(batch.expires_at),
        "finalizing_at": _ts(batch.finalizing_at),
        "completed_at": _ts(batch.completed_at),
        "failed_at": _ts(batch.failed_at),
        "expired_at": _ts(batch.expired_at),
        "cancelling_at": _ts(batch.cancelling_at),
        "cancelled_at": _ts(batch.cancelled_at),
        "request_counts": {
            "total": batch.total,
            "completed": batch.completed,
            "failed": batch.failed,
        },
        "metadata": batch.metadata,
    }


def page_of(items: list, has_more: bool, to_object) -> dict[str, Any]:
    data = [to_object(item) for item in items]
    return {
        "object": "list",
        "data": data,
        "has_more": has_more,
        "first_id": data[0]["id"] if data else None,
        "last_id": data[-1]["id"] if data else None,
    }
