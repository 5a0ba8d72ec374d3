from django.apps import AppConfig


class WebappConfig(AppConfig):
    name = "webapp"
    verbose_name = "Practicum"

    def ready(self) -> None:
        # The OpenAPI schema's description of our authentication classes.
        from webapp.kernel import schema  # noqa: F401
