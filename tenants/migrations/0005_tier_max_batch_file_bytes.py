from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("tenants", "0004_tenant_budget_when_redis_down"),
    ]

    operations = [
        migrations.AddField(
            model_name="tier",
            name="max_batch_file_bytes",
            field=models.PositiveBigIntegerField(
                default=104857600,
                help_text="Largest batch input file, in bytes (staff may set it per tier).",
            ),
        ),
    ]
