"""Deployment leaves this app's state: it is the serving app's model (same table)."""

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [
        ("feedback", "0014_serving_foreign_keys"),
        ("training", "0012_serving_models"),
    ]

    operations = [
        # State only: the tables, columns and constraints stay as they are.
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.DeleteModel(
                    name="Deployment",
                ),
            ],
        ),
    ]
