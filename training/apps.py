from django.apps import AppConfig


class TrainingConfig(AppConfig):
    name = "training"
    verbose_name = "Training and models"

    def ready(self) -> None:
        from django.conf import settings

        from feedback.services.stitching_backfill import trace_merged
        from training.environments.base import environment_modules_set
        from training.services.accounts import account_signals_connect
        from training.services.judge_audit import judge_audit_connect
        from training.services.training_sets import training_items_follow_merge

        environment_modules_set(settings.PRACTICUM_ENVIRONMENT_MODULES)
        trace_merged.connect(training_items_follow_merge, dispatch_uid="training_items_follow_merge")
        account_signals_connect()
        judge_audit_connect()
