"""Records of months already invoiced are marked billed by that invoice.

Before 0008 an invoice billed its month's records without marking them, so
a record settled after its month's invoice was never billed. From here on
the invoice marks what it bills, and later records of an invoiced month go
on the next invoice. Records of issued months are taken as billed by their
month's invoice (the late ones among them cannot be told apart).
"""

from datetime import UTC

from django.db import migrations, models
from django.db.models import OuterRef, Subquery
from django.db.models.functions import Cast, TruncMonth


def backfill(apps, schema_editor):
    UsageRecord = apps.get_model("billing", "UsageRecord")
    Invoice = apps.get_model("billing", "Invoice")
    month_invoice = Invoice.objects.filter(
        tenant_id=OuterRef("tenant_id"),
        # Cast: a truncation needs its argument's type, which an OuterRef
        # does not have until the outer query resolves it.
        period=Cast(
            TruncMonth(Cast(OuterRef("created_at"), models.DateTimeField()), tzinfo=UTC),
            models.DateField(),
        ),
    ).values("pk")[:1]
    UsageRecord.objects.filter(invoice__isnull=True).update(invoice_id=Subquery(month_invoice))


class Migration(migrations.Migration):
    # Its own migration: PostgreSQL refuses 0008's index and constraint
    # after row updates in the same transaction ("pending trigger events").
    dependencies = [("billing", "0008_usage_invoice")]

    operations = [migrations.RunPython(backfill, migrations.RunPython.noop)]
