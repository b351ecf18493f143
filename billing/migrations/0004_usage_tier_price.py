"""Usage records carry their tier and the price in force when they happened.

The fields come first; 0005 fills them in for the records written before.
"""

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("billing", "0003_billing_prices_invoices_budgets_gpu"),
        ("tenants", "0004_tenant_budget_when_redis_down"),
    ]

    operations = [
        migrations.AddField(
            model_name="usagerecord",
            name="price",
            field=models.ForeignKey(
                blank=True,
                null=True,
                on_delete=django.db.models.deletion.PROTECT,
                related_name="+",
                to="billing.price",
            ),
        ),
        migrations.AddField(
            model_name="usagerecord",
            name="tier",
            field=models.ForeignKey(
                blank=True,
                null=True,
                on_delete=django.db.models.deletion.PROTECT,
                related_name="+",
                to="tenants.tier",
            ),
        ),
    ]
