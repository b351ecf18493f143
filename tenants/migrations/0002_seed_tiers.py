"""Seed the free, pro and enterprise tiers.

The values are a frozen copy: a migration must keep meaning what it meant
when it ran, so later changes to tenants.services.DEFAULT_TIERS (or to rows
in the admin) need a migration of their own.
"""

from decimal import Decimal

from django.db import migrations

TIERS = [
    {
        "name": "free",
        "display_name": "Free",
        "rpm": 20,
        "tpm": 20_000,
        "monthly_token_quota": 1_000_000,
        "max_context_tokens": 2048,
        "max_output_tokens": 512,
        "max_concurrent_requests": 2,
        "scheduling_weight": Decimal("0.15"),
        "priority": 0,
        "queue_sla_seconds": 30,
        "api_access": False,
    },
    {
        "name": "pro",
        "display_name": "Pro",
        "rpm": 600,
        "tpm": 200_000,
        "monthly_token_quota": 50_000_000,
        "max_context_tokens": 8192,
        "max_output_tokens": 2048,
        "max_concurrent_requests": 16,
        "scheduling_weight": Decimal("0.35"),
        "priority": 1,
        "queue_sla_seconds": 10,
        "api_access": True,
    },
    {
        "name": "enterprise",
        "display_name": "Enterprise",
        "rpm": 3000,
        "tpm": 1_000_000,
        "monthly_token_quota": 1_000_000_000,
        "max_context_tokens": 8192,
        "max_output_tokens": 4096,
        "max_concurrent_requests": 64,
        "scheduling_weight": Decimal("0.50"),
        "priority": 2,
        "queue_sla_seconds": 5,
        "api_access": True,
    },
]


def seed_tiers(apps, schema_editor):
    Tier = apps.get_model("tenants", "Tier")
    for spec in TIERS:
        values = {key: value for key, value in spec.items() if key != "name"}
        Tier.objects.update_or_create(name=spec["name"], defaults=values)


def unseed_tiers(apps, schema_editor):
    Tier = apps.get_model("tenants", "Tier")
    # Tenants PROTECT their tier: only tiers nobody uses go away.
    Tier.objects.filter(name__in=[t["name"] for t in TIERS], tenants__isnull=True).delete()


class Migration(migrations.Migration):
    dependencies = [("tenants", "0001_initial")]

    operations = [migrations.RunPython(seed_tiers, unseed_tiers)]
