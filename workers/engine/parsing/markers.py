"""Scanning text for markers when it arrives in pieces: a marker is never split across two outputs."""
from __future__ import annotations

from collections.abc import Iterable


def partial_suffix(text: str, markers: Iterable[str]) -> int:
    """How many trailing characters of `text` could be the start of one of `markers` (held back)."""
    hold = 0
    for marker in markers:
        for length in range(min(len(marker) - 1, len(text)), hold, -1):
            if text.endswith(marker[:length]):
                hold = length
                break
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
