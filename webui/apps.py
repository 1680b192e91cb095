from django.apps import AppConfig


class WebUIConfig(AppConfig):
    name = "webui"
    verbose_name = "Browser pages"
    default_auto_field = "django.db.models.BigAutoField"
