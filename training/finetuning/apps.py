from django.apps import AppConfig


class FinetuningConfig(AppConfig):
    name = "training.finetuning"
    label = "finetuning"
    verbose_name = "OpenAI fine-tuning API"
