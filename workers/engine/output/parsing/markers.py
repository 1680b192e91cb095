"""Scanning text for markers when it arrives in pieces: a marker is never split across two outputs."""
from __future__ import annotations

from collections.abc import Iterable

from protocol import Part


def partial_suffix(text: str, markers: Iterable[str]) -> int:
    """How many trailing characters of `text` could be the start of one of `markers` (held back)."""
    hold = 0
    for marker in markers:
        index = text.find(marker[:1], max(len(text) - len(marker) + 1, 0))
        while 0 <= index < len(text) - hold:  # the longest candidate first
            if marker.startswith(text[index:]):
                hold = len(text) - index
                break
            index = text.find(marker[:1], index + 1)
    return hold


def earliest(text: str, markers: Iterable[str], start: int = 0) -> tuple[int, str] | None:
    """The first marker found in `text` (the longest where two start at one place), or None."""
    best: tuple[int, str] | None = None
    for marker in markers:
        index = text.find(marker, start)
        if index >= 0 and (best is None or index < best[0] or (index == best[0] and len(marker) > len(best[1]))):
            best = (index, marker)
    return best


def remove(text: str, markers: Iterable[str]) -> str:
    for marker in markers:
        if marker in text:
            text = text.replace(marker, "")
    return text


class SteppedParser:
    """A text parser that consumes its buffer one marker at a time (`_step`: True when it took one, False
    when it emitted what was safe and waits for more), then flushes what it held at the end (`_flush`)."""

    buffer = ""

    def feed(self, text: str, token_ids: list[int] | None = None) -> list[Part]:
        self.buffer += text
        out: list[Part] = []
        while self._step(out, final=False):
            pass
        return out

    def finish(self) -> list[Part]:
        out: list[Part] = []
        while self._step(out, final=True):
            pass
        self._flush(out)
        self.buffer = ""
        return out

    def _step(self, out: list[Part], final: bool) -> bool:
        raise NotImplementedError

    def _flush(self, out: list[Part]) -> None:
        raise NotImplementedError
