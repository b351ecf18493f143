"""Usage records carry their tier and the price in force when they happened.

Existing rows are backfilled: the tier is the tenant's tier now (no history
of tier changes was kept before this), the price the one in force for that
tier, model and the record's day (UTC), as invoices priced them until now.
Rows with no price in force keep a null price, as new ones do.
"""

from datetime import UTC

from django.db import migrations, models
from django.db.models import OuterRef, Subquery
from django.db.models.functions import Cast, TruncDate


def backfill(apps, schema_editor):
    UsageRecord = apps.get_model("billing", "UsageRecord")
    Price = apps.get_model("billing", "Price")
    Tenant = apps.get_model("tenants", "Tenant")
    tenant_tier = Tenant.objects.filter(pk=OuterRef("tenant_id")).values("tier_id")[:1]
    UsageRecord.objects.filter(tier__isnull=True).update(tier_id=Subquery(tenant_tier))
    in_force = (
        Price.objects.filter(
            tier_id=OuterRef("tier_id"),
            model=OuterRef("model"),
            # Cast: a truncation needs its argument's type, which an
            # OuterRef does not have until the outer query resolves it.
            effective_from__lte=TruncDate(
                Cast(OuterRef("created_at"), models.DateTimeField()), tzinfo=UTC
            ),
        )
        .order_by("-effective_from")
        .values("pk")[:1]
    )
    UsageRecord.objects.filter(price__isnull=True).update(price_id=Subquery(in_force))


class Migration(migrations.Migration):
    # A migration of its own: the schema editor creates 0004's indexes and
    # constraints at its end, which PostgreSQL refuses after row updates in
    # the same transaction ("pending trigger events").
    dependencies = [("billing", "0004_usage_tier_price")]

    operations = [migrations.RunPython(backfill, migrations.RunPython.noop)]
