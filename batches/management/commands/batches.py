"""``manage.py batches [list|cancel BATCH_ID]``: batches for operators.

``list`` prints the newest batches (``--tenant SLUG`` for one tenant's)
with status and line counts; ``cancel`` cancels one as its tenant would.
"""

from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError

from batches.models import Batch
from batches.selectors import batch_list_all
from batches.services.batches import batch_cancel
from inference.errors import APIError
from tenants.models import Tenant


class Command(BaseCommand):
    help = "List batches, or cancel one."

    def add_arguments(self, parser):
        sub = parser.add_subparsers(dest="action", required=True)
        listing = sub.add_parser("list", help="the newest batches")
        listing.add_argument("--tenant", help="a tenant's slug: its batches only")
        listing.add_argument("--limit", type=int, default=50)
        cancel = sub.add_parser("cancel", help="cancel a batch")
        cancel.add_argument("batch_id")

    def handle(self, *args, action: str, **options):
        if action == "list":
            self._list(options["tenant"], options["limit"])
        else:
            self._cancel(options["batch_id"])

    def _list(self, slug: str | None, limit: int) -> None:
        tenant = None
        if slug:
            tenant = Tenant.objects.filter(slug=slug).first()
            if tenant is None:
                raise CommandError(f"No tenant with slug {slug!r}.")
        for b in batch_list_all(tenant=tenant, limit=limit):
            self.stdout.write(
                f"{b.pk}  {b.tenant.slug}  {b.status:<11} {b.completed}+{b.failed}/{b.total}  "
                f"{b.created_at:%Y-%m-%d %H:%M}  {b.endpoint}"
            )

    def _cancel(self, batch_id: str) -> None:
        batch = Batch.objects.select_related("tenant").filter(pk=batch_id).first()
        if batch is None:
            raise CommandError(f"No batch {batch_id}.")
        try:
            batch = batch_cancel(tenant=batch.tenant, batch_id=batch_id)
        except APIError as exc:
            raise CommandError(exc.message) from exc
        self.stdout.write(f"{batch.pk} {batch.status}")
