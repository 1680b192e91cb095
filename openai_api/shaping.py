"""What the endpoint modules share in shaping a worker's answer: the `usage` object, the output parser,
Chat Completions' logprobs (Responses shows them the same way).

Each endpoint module (`completions`, `chat`, `responses`, …) imports from here, never from another
endpoint module.
"""
from __future__ import annotations

from protocol import Logprobs, Usage

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


def chat_logprobs(logprobs: Logprobs | None, top_n: int) -> list[dict]:
    """The worker's per-token logprobs in Chat Completions' `logprobs.content` shape."""
    if not logprobs:
        return []

    def entry(token: str, logprob: float) -> dict:
        return {"token": token, "logprob": logprob, "bytes": token_bytes(token)}

    content = []
    for token, logprob, top in zip(logprobs["tokens"], logprobs["token_logprobs"], logprobs["top_logprobs"]):
        ranked = sorted((top or {}).items(), key=lambda item: -item[1])[:top_n]
        content.append({**entry(token, logprob), "top_logprobs": [entry(t, lp) for t, lp in ranked]})
    return content


def token_bytes(token: str) -> list[int]:
    """A logprobs token's UTF-8 bytes; `bytes:\\xNN…` tokens (part of a character) carry theirs written out."""
    if token.startswith("bytes:\\x"):
        try:
            return list(bytes.fromhex(token[len("bytes:"):].replace("\\x", "")))
        except ValueError:  # generated text that merely starts with "bytes:\x"
            pass
    return list(token.encode("utf-8"))
