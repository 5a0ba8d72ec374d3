from django.apps import AppConfig
from django.apps import apps as global_apps
from django.contrib.auth.management import create_permissions
from django.db.models.signals import post_migrate

from webapp.kernel.roles import APPROVER, OPERATOR, REVIEWER, AppRoles, roles_sync

# Annotating a turn: comments, ratings, corrections.
_ANNOTATE = [
    "feedback.add_comment",
    "feedback.change_comment",
    "feedback.delete_comment",
    "feedback.add_turnrating",
    "feedback.add_correction",
]


def _sync_roles(sender, using: str = "default", **kwargs) -> None:
    # Permissions of apps migrated after this one do not exist yet when this handler runs.
    for app_config in global_apps.get_app_configs():
        create_permissions(app_config, verbosity=0, using=using, apps=global_apps)
    roles_sync(apps=global_apps)


class FeedbackConfig(AppConfig):
    name = "feedback"
    verbose_name = "Traces and feedback"
    roles = AppRoles(
        grants={
            OPERATOR: [
                "feedback.view_trace",
                "feedback.view_customerfeedback",
                *_ANNOTATE,
                "feedback.view_annotationqueue",
                "feedback.add_annotationqueue",
                "feedback.work_annotationqueue",
                # Spending judge calls: backfill batches, re-judging a turn, failure-mode runs.
                "feedback.add_judgejob",
                "feedback.add_failuremoderun",
            ],
            # No `view_trace`: a reviewer sees a trace only while holding its queue item, or
            # after finishing it (feedback/permissions.py).
            REVIEWER: [*_ANNOTATE, "feedback.view_annotationqueue", "feedback.work_annotationqueue"],
            APPROVER: ["feedback.view_trace"],
        }
    )

    def ready(self) -> None:
        post_migrate.connect(_sync_roles, sender=self, dispatch_uid="feedback_sync_roles")
