"""Files: stored through Django's storage API (the ``batches`` alias)."""

from __future__ import annotations

from collections.abc import Iterator

from django.core.files.base import ContentFile
from django.core.files.base import File as DjangoFile
from django.core.files.storage import Storage, storages
from django.db import transaction

from batches.errors import FileTooLarge, InvalidBatchRequest
from batches.models import File
from tenants.models import Tenant

UPLOAD_PURPOSES = (File.Purpose.BATCH, File.Purpose.BATCH_OUTPUT)


def batch_storage() -> Storage:
    """Local files by default; S3-compatible by configuration (docs/batches.md)."""
    return storages["batches"]


def _name(tenant: Tenant, file_id: str) -> str:
    # Per tenant, so an operator can list or purge one tenant's files.
    return f"{tenant.pk}/{file_id}.jsonl"


def file_upload(*, tenant: Tenant, purpose: str, filename: str, content, size: int) -> File:
    """Store an uploaded file of ``tenant``'s (``content``: a file object).

    Raises InvalidBatchRequest for an unknown purpose and FileTooLarge past
    the tier's ``max_batch_file_bytes``. The lines are checked when a batch
    uses the file, where their errors become the batch's.
    """
    if purpose not in UPLOAD_PURPOSES:
        raise InvalidBatchRequest(
            f"Invalid purpose {purpose!r}: this server accepts 'batch' (or 'batch_output').",
            param="purpose",
        )
    limit = tenant.tier.max_batch_file_bytes
    if size > limit:
        raise FileTooLarge(size, limit)
    if size == 0:
        raise InvalidBatchRequest("The file is empty.", param="file", code="empty_file")
    return _save(tenant=tenant, purpose=purpose, filename=filename, content=DjangoFile(content))


def file_write(*, tenant: Tenant, filename: str, data: bytes) -> File:
    """Store a file the platform produced (a batch's output or errors)."""
    return _save(
        tenant=tenant,
        purpose=File.Purpose.BATCH_OUTPUT,
        filename=filename,
        content=ContentFile(data),
    )


def _save(*, tenant: Tenant, purpose: str, filename: str, content) -> File:
    row = File(tenant=tenant, purpose=purpose, filename=filename[:255] or "upload.jsonl")
    storage = batch_storage()
    row.storage_name = storage.save(_name(tenant, row.id), content)
    row.bytes = storage.size(row.storage_name)
    try:
        row.full_clean()
        row.save(force_insert=True)
    except BaseException:
        # No row, no file: nothing is left behind for nobody to delete.
        storage.delete(row.storage_name)
        raise
    return row


def file_lines(*, file: File) -> Iterator[bytes]:
    """The stored file's lines, streamed (a large file is never read whole)."""
    with batch_storage().open(file.storage_name, "rb") as handle:
        yield from handle


def file_open(*, file: File):
    return batch_storage().open(file.storage_name, "rb")


@transaction.atomic
def file_delete(*, file: File) -> None:
    name = file.storage_name
    file.delete()
    # After the commit: a rolled-back delete must not lose the content.
    transaction.on_commit(lambda: batch_storage().delete(name))
