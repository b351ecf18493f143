"""The served-model catalog moves from the inference app to fleet.

State only: the table (``inference_servedmodel``) and its tier links stay
as they are; ``inference.0003`` removes the model from inference's state.
"""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("fleet", "0001_initial"),
        ("inference", "0002_register_demo_model"),
        ("tenants", "0002_seed_tiers"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.CreateModel(
                    name="ServedModel",
                    fields=[
                        (
                            "id",
                            models.BigAutoField(
                                auto_created=True,
                                primary_key=True,
                                serialize=False,
                                verbose_name="ID",
                            ),
                        ),
                        ("name", models.CharField(max_length=128, unique=True)),
                        ("path", models.CharField(blank=True, max_length=512)),
                        (
                            "context_length",
                            models.PositiveIntegerField(
                                help_text="Longest prompt + completion the model itself supports."
                            ),
                        ),
                        ("is_active", models.BooleanField(default=True)),
                        ("description", models.TextField(blank=True)),
                        ("created_at", models.DateTimeField(auto_now_add=True)),
                        (
                            "tiers",
                            models.ManyToManyField(
                                blank=True,
                                help_text="Tiers whose keys may call this model; "
                                "others get 404 model_not_found.",
                                related_name="served_models",
                                to="tenants.tier",
                            ),
                        ),
                    ],
                    options={"ordering": ["name"], "db_table": "inference_servedmodel"},
                ),
            ],
            database_operations=[],
        ),
    ]
