"""What the catalog refuses, in its own terms; `openai_api.errors` maps each to an HTTP status."""
from __future__ import annotations


class CatalogError(Exception):
    """A model name the catalog cannot serve."""

    def __init__(self, name: str, message: str) -> None:
        super().__init__(message)
        self.name = name
        self.message = message


class ModelNotFound(CatalogError):
    def __init__(self, name: str) -> None:
        super().__init__(name, f"The model `{name}` does not exist.")


class ModelDisabled(CatalogError):
    def __init__(self, name: str) -> None:
        super().__init__(name, f"The model `{name}` is disabled on this server.")


class NoWorker(Exception):
    """No worker answered a model-control request in time."""
