"""`POST /v1/chat/completions`: messages rendered by the worker's chat template, its answer shaped here.

The worker's parser (workers/engine/output/parsing, the model family's format) splits the answer into parts:
reasoning, content, tool calls and their arguments; this module turns them into OpenAI's message or
its chunks (a call's index, id and name first, then its arguments), so it never needs the tokenizer.
"""
from __future__ import annotations

import time
from collections.abc import AsyncIterator

from rest_framework.response import Response

from protocol import ChoiceDelta, Part, Started

from .base import GenerationView, sse_response
from .generation import Collected, GenerationStream
from .serializers.chat import ChatRequestSerializer
from .shaping import JoinedParts, chat_logprobs, text_parts, usage_body
from .vllm_shapes import RunningUsage, prompt_logprobs_body


def part_delta(part: Part) -> dict:
    """One part as a chunk's delta: a call opens with index, id and name, its arguments follow in pieces."""
    kind = part["type"]
    if kind == "tool_call":
        return {"tool_calls": [{"index": part["index"], "id": part["id"], "type": "function",
                                "function": {"name": part["name"], "arguments": ""}}]}
    if kind == "arguments":
        return {"tool_calls": [{"index": part["index"], "function": {"arguments": part["text"]}}]}
    return {"reasoning_content" if kind == "reasoning" else "content": part["text"]}


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


def assistant_message(reasoning: str, content: str, tool_calls: list[dict]) -> dict:
    message: dict = {"role": "assistant", "content": content if (content or not tool_calls) else None}
    if reasoning:
        message["reasoning_content"] = reasoning
    if tool_calls:
        message["tool_calls"] = tool_calls
    return message


class ChatShaper:
    """Turns worker deltas into `chat.completion` objects or `chat.completion.chunk` events."""

    def __init__(self, request_id: str, model: str, data: dict, started: Started) -> None:
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
        self.prompt_token_ids = (started.get("prompt_token_ids") or [None])[0]
        self.called: set[int] = set()  # choices that made a tool call (finish_reason "tool_calls")

    def _chunk(self, index: int, delta: dict, finish_reason: str | None = None, **extra) -> dict:
        choice = {"index": index, "delta": delta, "logprobs": None, "finish_reason": finish_reason, **extra}
        chunk = {**self.base, "object": "chat.completion.chunk", "choices": [choice]}
        if self.include_usage:
            chunk["usage"] = self.usage.body() if self.continuous_usage else None
        return chunk

    def _delta_chunks(self, delta: ChoiceDelta) -> list[dict]:
        index = delta["index"]
        self.usage.add(delta["token_ids"])
        parts = text_parts(delta)
        if any(part["type"] == "tool_call" for part in parts):
            self.called.add(index)
        extra: dict = {}
        if self.with_logprobs and delta["logprobs"] and delta["logprobs"]["tokens"]:
            extra["logprobs"] = {"content": chat_logprobs(delta["logprobs"], self.top_n)}
        if self.with_token_ids and delta["token_ids"]:
            extra["token_ids"] = delta["token_ids"]
        chunks = [self._chunk(index, part_delta(part)) for part in parts]
        if extra and not chunks:
            chunks.append(self._chunk(index, {}))
        if chunks:
            chunks[0]["choices"][0].update(extra)
        if delta["finish_reason"]:
            reason = final_reason(delta["finish_reason"], index in self.called)
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
        joined = JoinedParts()
        joined.add(text_parts(merged))
        if merged.get("prompt_logprobs") is not None:
            self.prompt_logprobs = merged["prompt_logprobs"]
        tool_calls = joined.tool_calls()
        choice = {
            "index": merged["index"],
            "message": assistant_message(joined.reasoning, self.echo + joined.content, tool_calls),
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
    model_task = "generate"

    async def respond(self, serializer, request_id: str, model: str, stream: GenerationStream):
        data = serializer.validated_data
        if data["stream"]:
            shaper = ChatShaper(request_id, model, data, stream.started)
            return sse_response(shaper.chunks(stream), stream)
        return Response(await self.whole_body(serializer, request_id, model, stream))

    async def whole_body(self, serializer, request_id: str, model: str, stream: GenerationStream) -> dict:
        shaper = ChatShaper(request_id, model, serializer.validated_data, stream.started)
        return shaper.body(await stream.collect())
