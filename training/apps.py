from importlib import import_module

from django.apps import AppConfig
from django.conf import settings

from training.environments.base import environment_modules_set

# The app's models besides `training.models` (which Django imports itself): promotion's and
# learning policies' live beside their code, under the app label `training` (their tables,
# content types and permissions are training's), and are imported with it, before any app is
# ready; no module imports another only to register it.
MODEL_MODULES = ("training.promotion.models", "training.promotion.rollout_models", "training.learning_policies.models")


class TrainingConfig(AppConfig):
    name = "training"
    verbose_name = "Training and models"

    def import_models(self) -> None:
        super().import_models()
        for module in MODEL_MODULES:
            import_module(module)

    def ready(self) -> None:
        from feedback.services.stitching_backfill import trace_merged
        from training.services.accounts import account_signals_connect
        from training.services.judge_audit import judge_audit_connect
        from training.services.training_sets import training_items_follow_merge

        environment_modules_set(settings.PRACTICUM_ENVIRONMENT_MODULES)
        trace_merged.connect(training_items_follow_merge, dispatch_uid="training_items_follow_merge")
        account_signals_connect()
        judge_audit_connect()
