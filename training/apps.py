from django.apps import AppConfig


class TrainingConfig(AppConfig):
    name = "training"
    verbose_name = "Training and models"

    def ready(self) -> None:
        from django.conf import settings

        from training.environments.base import environment_modules_set

        environment_modules_set(settings.PRACTICUM_ENVIRONMENT_MODULES)
