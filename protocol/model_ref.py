"""A model name as both sides use it: parsed once where a request names it, then passed along typed."""
from __future__ import annotations

from dataclasses import dataclass
from typing import TypedDict

DEFAULT_REVISION = "main"


class ModelRefDict(TypedDict):
    """A ModelRef on the wire (jobs and control messages carry the model already split)."""

    repo_id: str
    revision: str | None


@dataclass(frozen=True)
class ModelRef:
    """A model name split once: `repo`, `repo@main` and `repo@<commit>`.

    `str(ref)` is the name as written (what a response echoes); `key` is how every map
    names the model, so `repo` and `repo@main` are one model.
    """

    repo_id: str
    revision: str | None = None  # None: written without one (the default branch)

    @classmethod
    def parse(cls, name: str) -> ModelRef:
        repo_id, _, revision = name.partition("@")
        return cls(repo_id, revision or None)

    @property
    def branch(self) -> str:
        """The revision to load: the one written, else the default branch."""
        return self.revision or DEFAULT_REVISION

    @property
    def key(self) -> str:
        return f"{self.repo_id}@{self.branch}"

    def __str__(self) -> str:
        return self.repo_id if self.revision is None else f"{self.repo_id}@{self.revision}"

    def to_wire(self) -> ModelRefDict:
        return {"repo_id": self.repo_id, "revision": self.revision}

    @classmethod
    def from_wire(cls, value: ModelRefDict) -> ModelRef:
        return cls(value["repo_id"], value["revision"])
