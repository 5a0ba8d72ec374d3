from django.apps import AppConfig
from django.apps import apps as global_apps
from django.contrib.auth.management import create_permissions
from django.db.models.signals import post_migrate

from webapp.kernel.roles import roles_sync


def _sync_roles(sender, using: str = "default", **kwargs) -> None:
    # Permissions of apps migrated after this one do not exist yet when this handler runs.
    for app_config in global_apps.get_app_configs():
        create_permissions(app_config, verbosity=0, using=using, apps=global_apps)

    roles_sync(apps=global_apps)


class FeedbackConfig(AppConfig):
    name = "feedback"
    verbose_name = "Traces and feedback"

    def ready(self) -> None:
        post_migrate.connect(_sync_roles, sender=self, dispatch_uid="feedback_sync_roles")
