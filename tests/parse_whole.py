"""Test helper: a parser of the worker's (workers/engine/output/parsing) run over a whole text at once, and its parts joined."""
from __future__ import annotations

from workers.engine.output.parsing.families import REASONING_FORMATS, TOOL_FORMATS
from workers.engine.output.parsing.regions import RegionParser


def joined(parts: list[dict]) -> tuple[str, str, list[tuple[str, str]]]:
    """(reasoning, content, [(name, arguments)]) of a list of parts."""
    reasoning = "".join(p["text"] for p in parts if p["type"] == "reasoning")
    content = "".join(p["text"] for p in parts if p["type"] == "content")
    calls: dict[int, list[str]] = {}
    for part in parts:
        if part["type"] == "tool_call":
            calls[part["index"]] = [part["name"], ""]
        elif part["type"] == "arguments":
            calls[part["index"]][1] += part["text"]
    return reasoning, content, [tuple(calls[i]) for i in sorted(calls)]


def parse_text(text: str, reasoning_open: bool = False, parse_tools: bool = False,
               tool_parser: str = "hermes", reasoning_parser: str = "qwen3") -> tuple[str, str, list[tuple[str, str]]]:
    """The whole text at once (the tiny models' Hermes and <think> by default): (reasoning, content, calls)."""
    parser = RegionParser(REASONING_FORMATS.get(reasoning_parser), TOOL_FORMATS.get(tool_parser), parse_tools)
    parser.prime("<think>\n" if reasoning_open else "")
    return joined(parser.feed(text) + parser.finish())
