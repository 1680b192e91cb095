"""What teams refuse, in their own terms; `openai_api.errors` maps each to an HTTP status.

(`LimitExceeded`, a limit's refusal, lives with the limits in `teams.limits`.)
"""
from __future__ import annotations


class ModelNotAllowed(Exception):
    """A model the caller's team or key may not use. To the caller it does not exist: the message
    (and the API's 404) are those of an unknown model, naming it as the caller asked for it."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.message = f"The model `{name}` does not exist."
        super().__init__(self.message)
