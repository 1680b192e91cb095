"""inference-site: an OpenAI-compatible inference server for Hugging Face models, as a Django project."""

from protocol.version import __version__  # noqa: F401  (the OpenAPI schema's and --version's)
