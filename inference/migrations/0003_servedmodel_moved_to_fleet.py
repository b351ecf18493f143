"""The served-model catalog now lives in fleet (``fleet.0002``); state only."""

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [
        ("inference", "0002_register_demo_model"),
        ("fleet", "0002_servedmodel"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[migrations.DeleteModel(name="ServedModel")],
            database_operations=[],
        ),
    ]
