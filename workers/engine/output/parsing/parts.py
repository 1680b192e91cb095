"""The pieces a parsed answer is made of (protocol.Part), built in one place."""
from __future__ import annotations

import uuid

from protocol import Part


def new_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


def content(text: str) -> Part:
    return {"type": "content", "text": text}


def reasoning(text: str) -> Part:
    return {"type": "reasoning", "text": text}


def tool_call(index: int, name: str, call_id: str | None = None) -> Part:
    """A call opens: its index among the answer's calls, its id and name (its arguments follow)."""
    return {"type": "tool_call", "index": index, "id": call_id or new_call_id(), "name": name}


def arguments(index: int, text: str) -> Part:
    """A fragment of call `index`'s arguments (a JSON object as text, once all its fragments are joined)."""
    return {"type": "arguments", "index": index, "text": text}


def append(out: list[Part], part: Part) -> None:
    """Add a text piece, joined to the last one when it is of the same kind (one event, not two)."""
    if out and part["type"] in ("content", "reasoning") and out[-1]["type"] == part["type"]:
        out[-1] = {**out[-1], "text": out[-1]["text"] + part["text"]}
    elif part["type"] not in ("content", "reasoning") or part["text"]:
        out.append(part)


class Calls:
    """An answer's tool calls as they are found: indexes in order, at most `limit` (parallel_tool_calls false: 1)."""

    def __init__(self, limit: int | None = None) -> None:
        self.count = 0
        self.limit = limit

    def open(self, name: str, out: list[Part], call_id: str | None = None) -> int | None:
        """A call starts (its arguments to follow): its index, or None when it is past the limit (dropped)."""
        if self.limit is not None and self.count >= self.limit:
            return None
        out.append(tool_call(self.count, name, call_id))
        self.count += 1
        return self.count - 1

    def emit(self, name: str, args: str, out: list[Part]) -> None:
        """A whole call."""
        index = self.open(name, out)
        if index is not None:
            out.append(arguments(index, args))
