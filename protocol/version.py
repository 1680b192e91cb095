"""This project's version: what `serve --version`, `run_worker --version` and `client --version` print
(Django's own version alone said nothing about which server runs)."""

__version__ = "0.49.0"


def version_line(django_version: str) -> str:
    return f"inference-site {__version__} (Django {django_version})"
