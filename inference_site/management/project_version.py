"""`--version` on the project's commands prints inference-site's version, not Django's (Django's default)."""
import django

from inference_site import __version__


class ProjectVersionMixin:
    """Mixed into a BaseCommand: its --version names this project, with Django's beside it."""

    def get_version(self) -> str:
        return f"inference-site {__version__} (Django {django.get_version()})"
