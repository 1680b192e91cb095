"""`POST /v1/chat/completions`: messages rendered by the worker's chat template, output parsed here.

The worker streams plain text; `output_parsing.OutputParser` splits it into reasoning, content and
tool calls, so this module never needs the tokenizer.
"""
from __future__ import annotations

import time
from collections.abc import AsyncIterator

from rest_framework.response import Response

from protocol import ChoiceDelta, Logprobs, Started

from .base import GenerationView, sse_response
from .generation import Collected, GenerationStream
from .output_parsing import OutputParser, Piece
from .serializers.chat import ChatRequestSerializer
from .shaping import chat_logprobs, parser_for, usage_body
from .vllm_shapes import RunningUsage, prompt_logprobs_body


def piece_delta(piece: Piece) -> dict:
    if piece.kind == "tool_call":
        call = piece.tool_call
        return {"tool_calls": [{"index": call.index, **call.as_dict()}]}
    return {"reasoning_content" if piece.kind == "reasoning" else "content": piece.text}


def final_reason(reason: str | None, has_tool_calls: bool) -> str | None:
    return "tool_calls" if reason == "stop" and has_tool_calls else reason


def echo_text(data: dict) -> str:
    """vLLM's chat `echo`: the content of a final assistant message (else nothing)."""
    messages = data.get("messages") or []
    if not data.get("echo") or not messages or messages[-1]["role"] != "assistant":
        return ""
    content = messages[-1].get("content") or ""
    if isinstance(content, list):
        return "\n".join(part.get("text", "") for part in content if isinstance(part, dict))
    return content


def assistant_message(reasoning: str, content: str, tool_calls: list) -> dict:
    message: dict = {"role": "assistant", "content": content if (content or not tool_calls) else None}
    if reasoning:
        message["reasoning_content"] = reasoning
    if tool_calls:
        message["tool_calls"] = [call.as_dict() for call in tool_calls]
    return message


class ChatShaper:
    """Turns worker deltas into `chat.completion` objects or `chat.completion.chunk` events."""

    def __init__(self, request_id: str, model: str, data: dict, parse_tools: bool, started: Started) -> None:
        self.base = {"id": request_id, "created": int(time.time()), "model": model}
        self.n = data["n"]
        self.with_logprobs = data["logprobs"]
        self.top_n = data.get("top_logprobs") or 0
        self.with_token_ids = data["return_token_ids"]
        stream_options = data.get("stream_options") or {}
        self.include_usage = bool(stream_options.get("include_usage"))
        self.continuous_usage = self.include_usage and bool(stream_options.get("continuous_usage_stats"))
        self.usage = RunningUsage(sum(started.get("prompt_tokens") or ()))
        self.with_prompt_logprobs = data.get("prompt_logprobs") is not None
        self.prompt_logprobs: list | None = None
        self.echo = echo_text(data)
        self.parse_tools = parse_tools
        self.open_block = (started.get("open_blocks") or [""])[0]
        self.prompt_token_ids = (started.get("prompt_token_ids") or [None])[0]
        self.parsers: dict[int, OutputParser] = {}

    def _parser(self, index: int) -> OutputParser:
        if index not in self.parsers:
            self.parsers[index] = self.new_parser()
        return self.parsers[index]

    def new_parser(self) -> OutputParser:
        return parser_for(self.open_block, self.parse_tools)

    def _chunk(self, index: int, delta: dict, finish_reason: str | None = None, **extra) -> dict:
        choice = {"index": index, "delta": delta, "logprobs": None, "finish_reason": finish_reason, **extra}
        chunk = {**self.base, "object": "chat.completion.chunk", "choices": [choice]}
        if self.include_usage:
            chunk["usage"] = self.usage.body() if self.continuous_usage else None
        return chunk

    def _delta_chunks(self, delta: ChoiceDelta) -> list[dict]:
        index, parser = delta["index"], self._parser(delta["index"])
        self.usage.add(delta["token_ids"])
        pieces = parser.feed(delta["text"])
        if delta["finish_reason"]:
            pieces += parser.finish()
        extra: dict = {}
        if self.with_logprobs and delta["logprobs"] and delta["logprobs"]["tokens"]:
            extra["logprobs"] = {"content": chat_logprobs(delta["logprobs"], self.top_n)}
        if self.with_token_ids and delta["token_ids"]:
            extra["token_ids"] = delta["token_ids"]
        chunks = [self._chunk(index, piece_delta(piece)) for piece in pieces]
        if extra and not chunks:
            chunks.append(self._chunk(index, {}))
        if chunks:
            chunks[0]["choices"][0].update(extra)
        if delta["finish_reason"]:
            reason = final_reason(delta["finish_reason"], bool(parser.tool_calls))
            chunks.append(self._chunk(index, {}, reason))
        return chunks

    async def chunks(self, stream: GenerationStream) -> AsyncIterator[dict]:
        for index in range(self.n):
            first = self._chunk(index, {"role": "assistant", "content": ""})
            if self.with_token_ids and index == 0:
                first["prompt_token_ids"] = self.prompt_token_ids
            yield first
            if self.echo:  # vLLM's chat echo: the final assistant message's content comes first
                yield self._chunk(index, {"content": self.echo})
        async for event in stream.events():
            for delta in event.get("choices", ()):
                chunks = self._delta_chunks(delta)
                if self.with_prompt_logprobs and delta.get("prompt_logprobs") is not None:
                    chunks = chunks or [self._chunk(delta["index"], {})]
                    chunks[0]["prompt_logprobs"] = prompt_logprobs_body(delta["prompt_logprobs"])
                for chunk in chunks:
                    yield chunk
            if self.include_usage and "usage" in event:
                yield {**self.base, "object": "chat.completion.chunk", "choices": [], "usage": usage_body(event["usage"])}

    def _choice(self, merged: ChoiceDelta) -> dict:
        parser = self.new_parser()
        pieces = parser.feed(merged["text"]) + parser.finish()
        reasoning = "".join(piece.text for piece in pieces if piece.kind == "reasoning")
        content = self.echo + "".join(piece.text for piece in pieces if piece.kind == "content")
        if merged.get("prompt_logprobs") is not None:
            self.prompt_logprobs = merged["prompt_logprobs"]
        tool_calls = parser.tool_calls
        choice = {
            "index": merged["index"],
            "message": assistant_message(reasoning, content, tool_calls),
            "logprobs": {"content": chat_logprobs(merged["logprobs"], self.top_n)} if self.with_logprobs else None,
            "finish_reason": final_reason(merged["finish_reason"], bool(tool_calls)),
        }
        if self.with_token_ids:
            choice["token_ids"] = merged["token_ids"]
        return choice

    def body(self, answer: Collected) -> dict:
        body = {**self.base, "object": "chat.completion",
                "choices": [self._choice(choice) for choice in answer.choices], "usage": usage_body(answer.usage)}
        if self.with_token_ids:
            body["prompt_token_ids"] = self.prompt_token_ids
        if self.with_prompt_logprobs:
            body["prompt_logprobs"] = prompt_logprobs_body(self.prompt_logprobs)
        return body


class ChatCompletionsView(GenerationView):
    serializer_class = ChatRequestSerializer
    id_prefix = "chatcmpl"

    async def respond(self, serializer, request_id: str, model: str, stream: GenerationStream):
        data = serializer.validated_data
        if data["stream"]:
            shaper = ChatShaper(request_id, model, data, serializer.parse_tools, stream.started)
            return sse_response(shaper.chunks(stream), stream)
        return Response(await self.whole_body(serializer, request_id, model, stream))

    async def whole_body(self, serializer, request_id: str, model: str, stream: GenerationStream) -> dict:
        shaper = ChatShaper(request_id, model, serializer.validated_data, serializer.parse_tools, stream.started)
        return shaper.body(await stream.collect())
