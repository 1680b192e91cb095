"""Everything the worker refuses or fails at, in one place; each carries what the client is told.

Plain Python: the engine raises these, `engine.py` turns them into `protocol` error
messages, and the web side maps those to OpenAI's error shape.
"""
from __future__ import annotations

import protocol


class JobError(Exception):
    """A job the engine refuses up front; carries the HTTP status the client gets."""

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code

    def message_dict(self) -> protocol.ErrorMessage:
        return protocol.error_message(self.status, self.message, self.param, self.code)


class ModelLoadError(Exception):
    """The model could not be loaded; `not_found` when no such repo/files exist."""

    def __init__(self, message: str, not_found: bool = False) -> None:
        super().__init__(message)
        self.not_found = not_found

    @property
    def code(self) -> str:
        return "model_not_found" if self.not_found else "model_load_failed"

    @property
    def status(self) -> int:
        return 404 if self.not_found else 503


class MemoryBudgetError(ModelLoadError):
    """Loading would exceed the worker's memory budget and nothing idle can be unloaded."""

    @property
    def code(self) -> str:
        return "model_not_found" if self.not_found else "insufficient_memory"


class ModelBusyError(Exception):
    """The model has running or queued sequences; it is unloaded only when idle."""

    code = "model_busy"
