"""Test helper: the output parser run over a whole text at once."""
from __future__ import annotations

from openai_api.output_parsing import OutputParser, ToolCall


def parse_text(text: str, reasoning_open: bool = False, parse_tools: bool = False) -> tuple[str, str, list[ToolCall]]:
    """The whole text at once: (reasoning, content, tool calls)."""
    parser = OutputParser(reasoning_open, parse_tools)
    pieces = parser.feed(text) + parser.finish()
    reasoning = "".join(p.text for p in pieces if p.kind == "reasoning")
    content = "".join(p.text for p in pieces if p.kind == "content")
    return reasoning, content, parser.tool_calls
