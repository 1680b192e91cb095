"""The API's own rows: the Batch API's files, batches and lines (openai_api.batches.models)."""
from .batches.models import Batch, BatchLine, StoredFile

__all__ = ["Batch", "BatchLine", "StoredFile"]
