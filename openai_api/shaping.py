"""What the endpoint modules share in shaping a worker's answer: the `usage` object, a parsed answer's
parts joined (`JoinedParts`), Chat Completions' logprobs (Responses shows them the same way).

Each endpoint module (`completions`, `chat`, `responses`, …) imports from here, never from another
endpoint module.
"""
from __future__ import annotations

from protocol import ChoiceDelta, Logprobs, Part, Usage


def usage_body(usage: Usage) -> dict:
    """OpenAI's usage, with `prompt_tokens_details.cached_tokens`: the prompt tokens the prefix cache served."""
    return {
        "prompt_tokens": usage["prompt_tokens"],
        "completion_tokens": usage["completion_tokens"],
        "total_tokens": usage["prompt_tokens"] + usage["completion_tokens"],
        "prompt_tokens_details": {"cached_tokens": usage.get("cached_tokens", 0)},
    }


def text_parts(delta: ChoiceDelta) -> list[Part]:
    """The delta's parts (a parsed job's), else its text as content."""
    parts = delta.get("parts")
    if parts is not None:
        return parts
    return [{"type": "content", "text": delta["text"]}] if delta["text"] else []


class JoinedParts:
    """A choice's parts (protocol.Part, split by the worker's parser) joined into what a whole message holds."""

    def __init__(self) -> None:
        self.reasoning = ""
        self.content = ""
        self.calls: dict[int, dict] = {}  # by index: {"id", "type", "function": {"name", "arguments"}}

    def add(self, parts: list[Part]) -> None:
        for part in parts:
            kind = part["type"]
            if kind == "content":
                self.content += part["text"]
            elif kind == "reasoning":
                self.reasoning += part["text"]
            elif kind == "tool_call":
                self.calls[part["index"]] = {"id": part["id"], "type": "function",
                                             "function": {"name": part["name"], "arguments": ""}}
            elif kind == "arguments" and part["index"] in self.calls:
                self.calls[part["index"]]["function"]["arguments"] += part["text"]

    def tool_calls(self) -> list[dict]:
        return [self.calls[index] for index in sorted(self.calls)]


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
