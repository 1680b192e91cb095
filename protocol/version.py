"""The project's version: `manage.py serve --version` (and run_worker, client) and the OpenAPI schema's."""

__version__ = "1.0.0"
