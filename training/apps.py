from importlib import import_module

from django.apps import AppConfig
from django.conf import settings

from training.environments.base import environment_modules_set
from webapp.kernel.roles import APPROVER, OPERATOR, AppRoles

# The app's models besides `training.models` (which Django imports itself): promotion's and
# learning policies' live beside their code, under the app label `training` (their tables,
# content types and permissions are training's), and are imported with it, before any app is
# ready; no module imports another only to register it.
MODEL_MODULES = ("training.promotion.models", "training.promotion.rollout_models", "training.learning_policies.models")

# Evaluation and promotion: operators evaluate candidates and request promotions; approvers
# read the same pages and decide (approve, reject, roll back: `training.approve_promotion`).
_PROMOTION_READ = [
    "training.view_evaluation",
    "training.view_promotionrequest",
    "training.view_release",
    "training.view_auditevent",
]


class TrainingConfig(AppConfig):
    name = "training"
    verbose_name = "Training and models"
    roles = AppRoles(
        grants={
            OPERATOR: [
                # Turning feedback into weights: build training sets, start and cancel jobs.
                "training.view_trainingset",
                "training.add_trainingset",
                "training.view_trainingjob",
                "training.add_trainingjob",
                "training.change_trainingjob",
                *_PROMOTION_READ,
                "training.add_evaluation",
                "training.add_promotionrequest",
                # Learning policies: operators set them up (and answer for the requests they open).
                "training.view_learningpolicy",
                "training.add_learningpolicy",
                "training.change_learningpolicy",
            ],
            # Approvers read the policies beside the requests they decide.
            APPROVER: [
                "training.approve_promotion",
                "training.view_trainingjob",
                *_PROMOTION_READ,
                "training.view_learningpolicy",
            ],
        },
        # Requesting and approving a promotion: with a second account of their making, one admin
        # would be both people four eyes need.
        superuser_only=("training.add_promotionrequest", "training.approve_promotion"),
    )

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
