from django.apps import AppConfig


class ServingConfig(AppConfig):
    name = "training.serving"
    label = "serving"
    verbose_name = "Deployments and model versions"
