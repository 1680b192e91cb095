"""Splitting generated text into reasoning, content and tool calls, incrementally (no torch).

The worker streams plain text (with `<think>`/`<tool_call>` kept, as non-special tokens); this
parser turns it into typed pieces as it arrives. Text that could still grow into a tag is held
back until the next piece settles it, so a tag is never split across events.

- `<think>…</think>` (Qwen3, DeepSeek-R1): reasoning. `reasoning_open=True` starts inside it, for
  templates that open `<think>` in the prompt. The whitespace around the tags is dropped.
- `<tool_call>{"name": …, "arguments": {…}}</tool_call>` (Qwen / Hermes): a tool call, when tools
  are parsed; a block that is not valid JSON of that shape stays in the content, verbatim.
"""
from __future__ import annotations

import json
import uuid
from dataclasses import dataclass

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
TOOL_OPEN, TOOL_CLOSE = "<tool_call>", "</tool_call>"


def new_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


@dataclass
class ToolCall:
    index: int
    id: str
    name: str
    arguments: str  # a JSON object, as a string (OpenAI's shape)

    def as_dict(self) -> dict:
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}


@dataclass
class Piece:
    """One parsed event: kind is "reasoning", "content" or "tool_call"."""

    kind: str
    text: str = ""
    tool_call: ToolCall | None = None


def _partial_tag_length(text: str, tags: tuple[str, ...]) -> int:
    """How many trailing characters of `text` could be the start of one of `tags`."""
    hold = 0
    for tag in tags:
        for length in range(min(len(tag) - 1, len(text)), hold, -1):
            if text.endswith(tag[:length]):
                hold = length
                break
    return hold


def parse_tool_call(block: str) -> tuple[str, str] | None:
    """(name, arguments JSON) from a tool-call body, or None when it is not one."""
    try:
        payload = json.loads(block.strip())
    except ValueError:
        return None
    if not isinstance(payload, dict) or not isinstance(payload.get("name"), str):
        return None
    arguments = payload.get("arguments", payload.get("parameters", {}))
    if isinstance(arguments, str):
        return payload["name"], arguments
    return payload["name"], json.dumps(arguments, ensure_ascii=False)


class OutputParser:
    """Feed text deltas, get Pieces; `finish()` flushes what was held back."""

    def __init__(self, reasoning_open: bool = False, parse_tools: bool = False) -> None:
        self.mode = "reasoning" if reasoning_open else "content"
        self.parse_tools = parse_tools
        self.buffer = ""
        self.strip_leading = reasoning_open  # drop whitespace right after a tag
        self.tool_calls: list[ToolCall] = []

    def _open_tags(self) -> tuple[str, ...]:
        return (THINK_OPEN, TOOL_OPEN) if self.parse_tools else (THINK_OPEN,)

    def _emit(self, kind: str, text: str, out: list[Piece]) -> None:
        if self.strip_leading:
            text = text.lstrip()
        if not text:
            return
        self.strip_leading = False
        if out and out[-1].kind == kind and kind != "tool_call":
            out[-1].text += text
        else:
            out.append(Piece(kind, text))

    def prime(self, prefill: str) -> None:
        """Continue from text already in the prompt (a prefilled assistant turn): state only, no output.

        A prefill that opens `<think>` or `<tool_call>` makes what follows reasoning or a tool call.
        """
        self.feed(prefill)
        self.tool_calls.clear()
        if self.mode == "content":
            self.buffer = ""

    def feed(self, text: str) -> list[Piece]:
        self.buffer += text
        out: list[Piece] = []
        while self._step(out, final=False):
            pass
        return out

    def finish(self) -> list[Piece]:
        out: list[Piece] = []
        while self._step(out, final=True):
            pass
        if self.mode == "tool":  # an unterminated call: keep what the model wrote
            self._tool_block(self.buffer, out, closed=False)
        elif self.buffer:
            self._emit(self.mode, self.buffer if self.mode == "content" else self.buffer.rstrip(), out)
        self.buffer = ""
        return out

    def _step(self, out: list[Piece], final: bool) -> bool:
        """Consume one tag (True) or emit what is safe and stop (False)."""
        if self.mode == "reasoning":
            return self._until(THINK_CLOSE, out, final, on_found=self._close_reasoning)
        if self.mode == "tool":
            end = self.buffer.find(TOOL_CLOSE)
            if end < 0:
                return False
            parsed = self._tool_block(self.buffer[:end], out, closed=True)
            self.buffer = self.buffer[end + len(TOOL_CLOSE):]
            self.mode, self.strip_leading = "content", parsed
            return True
        found = [(i, tag) for tag in self._open_tags() if (i := self.buffer.find(tag)) >= 0]
        if not found:
            safe = len(self.buffer) if final else len(self.buffer) - _partial_tag_length(self.buffer, self._open_tags())
            if self.parse_tools and not final:  # trailing whitespace may precede a tool call
                safe = len(self.buffer[:safe].rstrip())
            self._emit("content", self.buffer[:safe], out)
            self.buffer = self.buffer[safe:]
            return False
        index, tag = min(found)
        self._emit("content", self.buffer[:index].rstrip() if tag == TOOL_OPEN else self.buffer[:index], out)
        self.buffer = self.buffer[index + len(tag):]
        self.mode = "reasoning" if tag == THINK_OPEN else "tool"
        self.strip_leading = True
        return True

    def _until(self, tag: str, out: list[Piece], final: bool, on_found) -> bool:
        index = self.buffer.find(tag)
        if index >= 0:
            self._emit(self.mode, self.buffer[:index].rstrip(), out)
            self.buffer = self.buffer[index + len(tag):]
            on_found()
            return True
        if final:
            return False
        # Hold back a partial closing tag and trailing whitespace (it may precede the tag).
        safe = len(self.buffer) - _partial_tag_length(self.buffer, (tag,))
        safe = len(self.buffer[:safe].rstrip())
        self._emit(self.mode, self.buffer[:safe], out)
        self.buffer = self.buffer[safe:]
        return False

    def _close_reasoning(self) -> None:
        self.mode, self.strip_leading = "content", True

    def _tool_block(self, block: str, out: list[Piece], closed: bool) -> bool:
        """Emit a tool call, or the block verbatim as content when it is not one; True for a call."""
        parsed = parse_tool_call(block)
        if parsed is None:
            self.strip_leading = False
            self._emit("content", TOOL_OPEN + block + (TOOL_CLOSE if closed else ""), out)
            return False
        call = ToolCall(len(self.tool_calls), new_call_id(), parsed[0], parsed[1])
        self.tool_calls.append(call)
        out.append(Piece("tool_call", tool_call=call))
        return True
