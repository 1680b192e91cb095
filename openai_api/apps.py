from django.apps import AppConfig


class OpenaiApiConfig(AppConfig):
    default_auto_field = "django.db.models.BigAutoField"
    name = "openai_api"

    def ready(self) -> None:
        from . import schema  # noqa: F401  (registers the OpenAPI extensions)
        from .batches import schema as batch_schema  # noqa: F401  (the Files and Batch APIs')
