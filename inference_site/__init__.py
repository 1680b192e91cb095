"""inference-site: an OpenAI-compatible inference server for Hugging Face models, as a Django project."""

# The project's version: `manage.py serve --version` (and run_worker, client) and the OpenAPI schema's.
__version__ = "1.0.0"
