"""The role groups (operator, reviewer, approver, admin) and their permissions."""

from django.db import migrations


def forwards(apps, schema_editor):
    from django.contrib.auth.management import create_permissions

    from webapp.kernel.roles import roles_sync

    # Model permissions are normally created after all migrations; the groups need them now.
    for app_config in apps.get_app_configs():
        app_config.models_module = True
        create_permissions(app_config, apps=apps, verbosity=0)
        app_config.models_module = None
    roles_sync(apps=apps, during_migration=True)


class Migration(migrations.Migration):
    dependencies = [
        ("feedback", "0004_trace_search_vector"),
        ("training", "0001_initial"),
        ("auth", "0012_alter_user_first_name_max_length"),
        ("contenttypes", "0002_remove_content_type_name"),
    ]

    operations = [migrations.RunPython(forwards, migrations.RunPython.noop)]
