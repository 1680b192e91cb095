"""What the endpoint modules share in shaping a worker's answer: the `usage` object and the output parser.

Each endpoint module (`completions`, `chat`, `responses`, …) imports from here, never from another
endpoint module.
"""
from __future__ import annotations

from protocol import Usage

from .output_parsing import OutputParser


def usage_body(usage: Usage) -> dict:
    return {
        "prompt_tokens": usage["prompt_tokens"],
        "completion_tokens": usage["completion_tokens"],
        "total_tokens": usage["prompt_tokens"] + usage["completion_tokens"],
    }


def parser_for(open_block: str, parse_tools: bool) -> OutputParser:
    """A parser that continues where the prompt left off (inside `<think>` or `<tool_call>`, or not)."""
    parser = OutputParser(parse_tools=parse_tools)
    if open_block:
        parser.prime(open_block)
    return parser
