"""The formats most families write: reasoning and tool calls in regions between markers.

A `Region` opens at a marker and closes at another (or runs to the end of the answer); what lies
outside every region is content. Text that could still grow into a marker is held back until the
next piece settles it, so a marker is never split across events. The whitespace right after a
marker, and before a tool-call region, is dropped. A tool-call region's body goes to the family's
call syntax as it arrives (reading.py): calls open as their names are read and their arguments
stream. Where the body stops being calls, the rest of the region stays in the content verbatim
(markers and all; the whole region where no call had opened): malformed text is text the client
sees, never an error.
"""
from __future__ import annotations

from dataclasses import dataclass

from protocol import Part

from . import parts
from .markers import SteppedParser, earliest, partial_suffix, remove
from .reading import CallReader, CallSyntax


@dataclass(frozen=True)
class Region:
    kind: str  # "reasoning" or "tool"
    open: str
    close: str | None = None  # None: to the end of the answer
    at_start: bool = False  # opens only where the answer begins (leading whitespace aside): llama3's "{"
    keep_open: bool = False  # the opening text is part of the body ("{", "[")


@dataclass(frozen=True)
class TextFormat:
    """One side of a family's format: its reasoning regions, or its tool-call regions and syntax."""

    regions: tuple[Region, ...] = ()
    calls: CallSyntax | None = None
    drop: tuple[str, ...] = ()  # end-of-turn markers that are neither content nor a region
    starts_in_reasoning: bool = False  # the answer is reasoning until its close (DeepSeek R1's)


class RegionParser(SteppedParser):
    """Feed text pieces, get Parts; `finish()` flushes what was held back."""

    def __init__(self, reasoning: TextFormat | None, tools: TextFormat | None, parse_tools: bool,
                 tool_schemas: dict | None = None, calls: parts.Calls | None = None) -> None:
        self.regions = [*(reasoning.regions if reasoning else ()), *(tools.regions if tools and parse_tools else ())]
        self.call_syntax = tools.calls if tools and parse_tools else None
        self.drop = tuple(sorted({*(reasoning.drop if reasoning else ()), *(tools.drop if tools else ())}))
        self.starts_in_reasoning = bool(reasoning and reasoning.starts_in_reasoning)
        self.anywhere = [r for r in self.regions if not r.at_start]
        self.at_start_regions = [r for r in self.regions if r.at_start]
        self.open_markers = tuple(r.open for r in self.anywhere) + self.drop
        self.tool_schemas = tool_schemas or {}
        self.calls = calls or parts.Calls()
        self.parse_tools = parse_tools
        self.region: Region | None = None  # None: content
        self.reader: CallReader | None = None  # the open tool region's (None: its text is content)
        self.buffer = ""
        self.at_start = True  # no content yet: an at-start region may still open
        self.strip = False  # drop the whitespace before the next text (right after a marker)

    # --- priming ------------------------------------------------------------
    def prime(self, prompt_text: str) -> None:
        """Start where the prompt left off: inside a region it opened and did not close (a template's
        `<think>`, a prefilled call), else in content; state only, nothing is emitted."""
        best: tuple[int, Region] | None = None
        for region in self.anywhere:
            if region.close is None:
                continue
            opened = prompt_text.rfind(region.open)
            if opened >= 0 and prompt_text.rfind(region.close) < opened and (best is None or opened > best[0]):
                best = (opened, region)
        if best is not None:
            self._enter(best[1], prompt_text[best[0] + len(best[1].open):])
            self.strip = not self.buffer.strip()
            if self.region.kind == "reasoning":  # what the prompt itself reasoned is not this answer's
                self.buffer = ""
            return
        if self.starts_in_reasoning:
            reasoning = next((r for r in self.anywhere if r.kind == "reasoning" and r.close), None)
            if reasoning is not None and not prompt_text.rstrip().endswith(reasoning.close):
                self.region, self.strip = reasoning, True

    # --- feeding (SteppedParser's feed and finish) ------------------------------
    def _flush(self, out: list[Part]) -> None:
        if self.region is not None and self.region.kind == "tool":
            # the answer's end closes a region that has no closing marker; one that has was cut
            self._read_calls(self.buffer, out, final=True, closed=self.region.close is None)
        elif self.region is not None:
            self._emit("reasoning", self.buffer.rstrip(), out)
        else:
            self._emit("content", self.buffer, out)

    def _emit(self, kind: str, text: str, out: list[Part]) -> None:
        if self.strip:
            text = text.lstrip()
        if not text:
            return
        self.strip = False
        if kind == "content":
            self.at_start = False
        parts.append(out, parts.content(text) if kind == "content" else parts.reasoning(text))

    def _step(self, out: list[Part], final: bool) -> bool:
        """Consume one marker (True) or emit what is safe and stop (False)."""
        if self.region is None:
            return self._content_step(out, final)
        if self.region.kind == "reasoning":
            return self._reasoning_step(out, final)
        return self._tool_step(out, final)

    def _content_step(self, out: list[Part], final: bool) -> bool:
        if self.at_start and self.at_start_regions:
            stripped = self.buffer.lstrip()
            for region in self.at_start_regions:
                if stripped.startswith(region.open):
                    self._enter(region, stripped if region.keep_open else stripped[len(region.open):])
                    return True
            if not final and (not stripped or any(r.open.startswith(stripped) for r in self.at_start_regions)):
                return False  # cannot tell yet whether the answer opens a call
            self.at_start = False
        found = earliest(self.buffer, self.open_markers)
        if found is None:
            safe = len(self.buffer) if final else len(self.buffer) - partial_suffix(self.buffer, self.open_markers)
            if self.parse_tools and not final:  # trailing whitespace may precede a tool call
                safe = len(self.buffer[:safe].rstrip())
            self._emit("content", self.buffer[:safe], out)
            self.buffer = self.buffer[safe:]
            return False
        index, marker = found
        region = next((r for r in self.anywhere if r.open == marker), None)
        before = self.buffer[:index]
        self._emit("content", before.rstrip() if region is not None and region.kind == "tool" else before, out)
        rest = self.buffer[index + len(marker):]
        if region is None:  # a dropped marker
            self.buffer = rest
            return True
        self._enter(region, marker + rest if region.keep_open else rest)
        return True

    def _enter(self, region: Region, rest: str) -> None:
        self.region, self.buffer, self.strip = region, rest, True
        if region.kind == "tool":
            self.reader = CallReader(self.call_syntax, self.calls, self.tool_schemas)

    def _reasoning_step(self, out: list[Part], final: bool) -> bool:
        close = self.region.close
        found = earliest(self.buffer, (close, *self.drop)) if close else earliest(self.buffer, self.drop)
        if found is not None:
            index, marker = found
            self._emit("reasoning", self.buffer[:index].rstrip() if marker == close else self.buffer[:index], out)
            self.buffer = self.buffer[index + len(marker):]
            if marker == close:
                self.region, self.strip = None, True
            return True
        if final:
            return False
        safe = len(self.buffer) - partial_suffix(self.buffer, (*((close,) if close else ()), *self.drop))
        safe = len(self.buffer[:safe].rstrip())  # trailing whitespace may precede the close
        self._emit("reasoning", self.buffer[:safe], out)
        self.buffer = self.buffer[safe:]
        return False

    def _tool_step(self, out: list[Part], final: bool) -> bool:
        """Pass the region's settled text to its reader (its closing marker consumed: True)."""
        close = self.region.close
        end = self.buffer.find(close) if close else -1
        if end >= 0:
            self._read_calls(self.buffer[:end], out, final=True, closed=True)
            if self.reader is None:  # not calls: the marker stays with the text
                self._emit("content", close, out)
            self.region, self.reader, self.strip = None, None, self.reader is not None
            self.buffer = self.buffer[end + len(close):]
            return True
        if not final:
            safe = len(self.buffer) - partial_suffix(self.buffer, (*((close,) if close else ()), *self.drop))
            self._read_calls(self.buffer[:safe], out, final=False)
            self.buffer = self.buffer[safe:]
        return False

    def _read_calls(self, body: str, out: list[Part], final: bool, closed: bool = False) -> None:
        """Read a piece of the region's body; where it stops being calls, it and the rest are content."""
        body = remove(body, self.drop)
        if self.reader is None:
            self._emit("content", body, out)
            return
        rest = self.reader.feed(body, out, final, closed)
        if rest is None:
            return
        opener = "" if self.reader.opened or self.region.keep_open else self.region.open
        self.reader, self.strip = None, False
        self._emit("content", opener + rest, out)
