"""`--version` on the project's commands (serve, client, run_worker) prints inference-site's version, not
Django's (Django's default); here, in the lowest app, so every package's commands may use it."""
import django

from protocol.version import __version__


class ProjectVersionMixin:
    """Mixed into a BaseCommand: its --version names this project, with Django's beside it."""

    def get_version(self) -> str:
        return f"inference-site {__version__} (Django {django.get_version()})"
