"""inference-site: an OpenAI-compatible inference server for Hugging Face models, as a Django project."""

__version__ = "0.49.0"


def version_line() -> str:
    """What `serve --version` (and the other commands of ours) print: this project's version first, since
    Django's alone says nothing about which server is running."""
    import django

    return f"inference-site {__version__} (Django {django.get_version()})"
