from django.db import migrations, models


def enterprise_may_use_priority(apps, schema_editor):
    # The seeded tiers as tenants.services.DEFAULT_TIERS has them now.
    Tier = apps.get_model("tenants", "Tier")
    Tier.objects.filter(name="enterprise").update(priority_service_tier=True)


class Migration(migrations.Migration):
    dependencies = [
        ("tenants", "0004_tenant_budget_when_redis_down"),
    ]

    operations = [
        migrations.AddField(
            model_name="tier",
            name="priority_service_tier",
            field=models.BooleanField(
                default=False,
                help_text="Requests may ask for service_tier 'priority': scheduled ahead of the tier's default class and billed at the price's priority multiplier.",
            ),
        ),
        migrations.AddField(
            model_name="tier",
            name="auto_service_tier",
            field=models.CharField(
                choices=[("default", "Default"), ("priority", "Priority")],
                default="default",
                help_text="What service_tier 'auto' (or none) is served at; 'priority' only where the tier may use priority.",
                max_length=8,
            ),
        ),
        migrations.RunPython(enterprise_may_use_priority, migrations.RunPython.noop),
    ]
