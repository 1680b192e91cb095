"""inference-site: an OpenAI-compatible inference server for Hugging Face models, as a Django project."""
from protocol.version import __version__


def version_line() -> str:
    """What `serve --version` and `client --version` print: this project's version first."""
    import django

    from protocol.version import version_line as line

    return line(django.get_version())


__all__ = ["__version__", "version_line"]
