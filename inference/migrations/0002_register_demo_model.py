"""Register the demo model for every tier, so a fresh install can chat at once."""

from django.conf import settings
from django.db import migrations

DEMO_CONTEXT_LENGTH = 8192


def register_demo_model(apps, schema_editor):
    ServedModel = apps.get_model("inference", "ServedModel")
    Tier = apps.get_model("tenants", "Tier")
    model, _ = ServedModel.objects.get_or_create(
        name=settings.DEMO_MODEL_NAME,
        defaults={
            "path": "",
            "context_length": DEMO_CONTEXT_LENGTH,
            "description": "SmolLM2-135M-Instruct, the demo model (converted from GGUF).",
        },
    )
    model.tiers.add(*Tier.objects.all())


def unregister_demo_model(apps, schema_editor):
    ServedModel = apps.get_model("inference", "ServedModel")
    ServedModel.objects.filter(name=settings.DEMO_MODEL_NAME, path="").delete()


class Migration(migrations.Migration):
    dependencies = [
        ("inference", "0001_initial"),
        ("tenants", "0002_seed_tiers"),
    ]

    operations = [migrations.RunPython(register_demo_model, unregister_demo_model)]
