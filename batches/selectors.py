"""Reads of the batches app, always scoped to one tenant (or staff's all)."""

from __future__ import annotations

from dataclasses import dataclass

from django.db.models import QuerySet

from batches.errors import BatchNotFound, FileNotFound
from batches.models import Batch, File
from tenants.models import Tenant


@dataclass(slots=True)
class Page:
    """One page of a cursor-paginated list (OpenAI's ``after`` / ``limit``)."""

    items: list
    has_more: bool


def file_get(*, tenant: Tenant, file_id: str) -> File:
    """The tenant's file; another tenant's is as unknown as a missing one."""
    file = File.objects.filter(tenant=tenant, pk=file_id).first()
    if file is None:
        raise FileNotFound(file_id)
    return file


def file_list(
    *, tenant: Tenant, purpose: str | None = None, after: str | None = None, limit: int = 100
) -> Page:
    files = File.objects.filter(tenant=tenant)
    if purpose:
        files = files.filter(purpose=purpose)
    return _page(files, File, tenant=tenant, after=after, limit=limit)


def batch_get(*, tenant: Tenant, batch_id: str) -> Batch:
    batch = Batch.objects.filter(tenant=tenant, pk=batch_id).first()
    if batch is None:
        raise BatchNotFound(batch_id)
    return batch


def batch_list(*, tenant: Tenant, after: str | None = None, limit: int = 20) -> Page:
    return _page(
        Batch.objects.filter(tenant=tenant), Batch, tenant=tenant, after=after, limit=limit
    )


def batch_list_all(*, tenant: Tenant | None = None, limit: int = 100) -> QuerySet[Batch]:
    """Newest first, a tenant's or (staff, operators) everyone's."""
    batches = Batch.objects.select_related("tenant")
    if tenant is not None:
        batches = batches.filter(tenant=tenant)
    return batches.order_by("-created_at", "-id")[:limit]


@dataclass(slots=True, frozen=True)
class BatchProgress:
    """What a progress bar shows of one batch."""

    id: str
    status: str
    total: int
    completed: int
    failed: int
    done: bool
    output_file_id: str | None
    error_file_id: str | None


def batch_progress(*, tenant: Tenant | None, limit: int = 100) -> list[BatchProgress]:
    """The progress of the batches ``batch_list_all`` lists (a tenant's, or all)."""
    return [
        BatchProgress(
            b.pk,
            b.status,
            b.total,
            b.completed,
            b.failed,
            b.done,
            b.output_file_id,
            b.error_file_id,
        )
        for b in batch_list_all(tenant=tenant, limit=limit)
    ]


def _page(rows: QuerySet, model, *, tenant: Tenant, after: str | None, limit: int) -> Page:
    # Newest first; the cursor is the last id seen. Ids are random, so the
    # order is (created_at, id) and the cursor row's own values bound it.
    rows = rows.order_by("-created_at", "-id")
    if after:
        cursor = model.objects.filter(tenant=tenant, pk=after).values("created_at", "id").first()
        if cursor is not None:
            rows = rows.filter(created_at__lte=cursor["created_at"]).exclude(
                created_at=cursor["created_at"], id__gte=cursor["id"]
            )
    items = list(rows[: limit + 1])
    return Page(items[:limit], len(items) > limit)
