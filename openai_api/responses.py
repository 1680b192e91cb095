"""`POST /v1/responses`: the Responses API over the same chat job.

One state machine (`ResponseBuilder`) turns parsed pieces into output items and the OpenAI
event sequence; the non-streamed answer is the final `response` of that same sequence. With
`store` (the default) the answer is kept (openai_api.response_store); `background` runs it on
(openai_api.response_runs) while the client polls; the stored-response endpoints are in
openai_api.response_views (ResponsesView too).
"""
from __future__ import annotations

import time
from collections.abc import AsyncIterator, Iterator

from protocol import ChoiceDelta, Part, Usage
from protocol.random_ids import random_hex

from .generation import GenerationStream
from .shaping import chat_logprobs, text_parts


def item_id(prefix: str) -> str:
    return f"{prefix}_{random_hex()}"


class ResponseBuilder:
    """Output items and events of one response; `events()` yields them in OpenAI's order."""

    def __init__(self, response_id: str, model: str, data: dict) -> None:
        self.with_logprobs = "message.output_text.logprobs" in (data.get("include") or ())
        self.top_n = data.get("top_logprobs") or 0
        self.max_tool_calls = data.get("max_tool_calls")
        self.tool_calls = 0
        self.sequence = 0
        self.output: list[dict] = []
        self.current: dict | None = None  # the open reasoning, message or function_call item
        self.dropped_call: int | None = None  # a call past max_tool_calls: its arguments are dropped too
        self.status = "in_progress"
        self.finish_reason: str | None = None
        self.response = {
            "id": response_id, "object": "response", "created_at": int(time.time()), "status": "in_progress",
            "model": model, "output": self.output, "error": None, "incomplete_details": None,
            "instructions": data.get("instructions"), "max_output_tokens": data.get("max_output_tokens"),
            "temperature": data.get("temperature"), "top_p": data.get("top_p"),
            "tools": data.get("tools") or [], "tool_choice": data.get("tool_choice") or "auto",
            "parallel_tool_calls": data.get("parallel_tool_calls", True) is not False,
            "previous_response_id": data.get("previous_response_id"), "store": bool(data.get("store")),
            "metadata": data.get("metadata") or {},
            "text": {"format": {"type": (data.get("response_format") or {}).get("type", "text")}},
            "usage": None, "user": data.get("user"), "background": bool(data.get("background")),
            "reasoning": {"effort": (data.get("reasoning") or {}).get("effort"), "summary": None},
            "service_tier": data.get("service_tier") or "default", "top_logprobs": data.get("top_logprobs") or 0,
            "truncation": data.get("truncation") or "disabled", "max_tool_calls": self.max_tool_calls,
            "safety_identifier": data.get("safety_identifier"), "prompt_cache_key": data.get("prompt_cache_key"),
        }

    def queued(self) -> dict:
        """The response as a background request first answers it."""
        self.status = "queued"
        return self._snapshot()

    def failed(self, code: str, message: str) -> dict:
        self.status = "failed"
        self.response["error"] = {"code": code, "message": message}
        return self._snapshot()

    def _event(self, kind: str, **fields) -> dict:
        self.sequence += 1
        return {"type": kind, "sequence_number": self.sequence - 1, **fields}

    def _snapshot(self) -> dict:
        return {**self.response, "status": self.status, "output": [dict(item) for item in self.output]}

    def start(self) -> Iterator[dict]:
        yield self._event("response.created", response=self._snapshot())
        yield self._event("response.in_progress", response=self._snapshot())

    def _open(self, kind: str) -> Iterator[dict]:
        yield from self._close()
        index = len(self.output)
        if kind == "reasoning":
            item = {"type": "reasoning", "id": item_id("rs"), "summary": [], "content": [], "status": "in_progress"}
            part = {"type": "reasoning_text", "text": ""}
        else:
            item = {"type": "message", "id": item_id("msg"), "status": "in_progress", "role": "assistant", "content": []}
            part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
        self.output.append(item)
        self.current = item
        yield self._event("response.output_item.added", output_index=index, item={**item, "content": []})
        item["content"].append(part)
        yield self._event("response.content_part.added", item_id=item["id"], output_index=index, content_index=0,
                          part=dict(part))

    def _close(self) -> Iterator[dict]:
        item, self.current = self.current, None
        if item is None:
            return
        index = self.output.index(item)
        if item["type"] == "function_call":
            yield self._event("response.function_call_arguments.done", item_id=item["id"], output_index=index,
                              name=item["name"], arguments=item["arguments"])
            item["status"] = "completed"
            yield self._event("response.output_item.done", output_index=index, item=dict(item))
            return
        part = item["content"][0]
        common = {"item_id": item["id"], "output_index": index, "content_index": 0}
        if item["type"] == "reasoning":
            yield self._event("response.reasoning_text.done", text=part["text"], **common)
        else:
            yield self._event("response.output_text.done", text=part["text"], logprobs=part["logprobs"], **common)
        yield self._event("response.content_part.done", part=dict(part), **common)
        item["status"] = "completed"
        yield self._event("response.output_item.done", output_index=index, item=item)

    def delta(self, delta: ChoiceDelta) -> Iterator[dict]:
        """The events of one step's parts (the worker's parser split its text)."""
        if delta["finish_reason"]:
            self.finish_reason = delta["finish_reason"]
        logprobs = chat_logprobs(delta["logprobs"], self.top_n) if self.with_logprobs else []
        yield from self.parts(text_parts(delta), logprobs)

    def parts(self, parts: list[Part], logprobs: list[dict] | None = None) -> Iterator[dict]:
        """`logprobs`: the step's tokens, given to the step's first answer text (a step's tokens make one piece
        of text, except where a tag closes reasoning; the tokens of reasoning are not output_text's)."""
        for part in parts:
            kind = part["type"]
            if kind == "tool_call":
                yield from self._function_call(part)
                continue
            if kind == "arguments":
                yield from self._arguments(part)
                continue
            if self.current is None or self.current["type"] != ("reasoning" if kind == "reasoning" else "message"):
                yield from self._open(kind)
            item = self.current
            item["content"][0]["text"] += part["text"]
            common = {"item_id": item["id"], "output_index": len(self.output) - 1, "content_index": 0}
            if kind == "reasoning":
                yield self._event("response.reasoning_text.delta", delta=part["text"], **common)
            else:
                step_logprobs, logprobs = logprobs or [], []
                item["content"][0]["logprobs"].extend(step_logprobs)
                yield self._event("response.output_text.delta", delta=part["text"], logprobs=step_logprobs, **common)

    def _function_call(self, part: Part) -> Iterator[dict]:
        """A call opens: a function_call item with its call id and name; its arguments follow."""
        self.tool_calls += 1
        yield from self._close()
        if self.max_tool_calls is not None and self.tool_calls > self.max_tool_calls:
            self.dropped_call = part["index"]  # max_tool_calls: calls past it are dropped
            return
        index = len(self.output)
        item = {"type": "function_call", "id": item_id("fc"), "call_id": part["id"], "name": part["name"],
                "arguments": "", "status": "in_progress"}
        self.output.append(item)
        self.current = item
        yield self._event("response.output_item.added", output_index=index, item=dict(item))

    def _arguments(self, part: Part) -> Iterator[dict]:
        item = self.current
        if item is None or item["type"] != "function_call" or part["index"] == self.dropped_call:
            return
        item["arguments"] += part["text"]
        yield self._event("response.function_call_arguments.delta", item_id=item["id"],
                          output_index=len(self.output) - 1, delta=part["text"])

    def finish(self, usage: Usage) -> Iterator[dict]:
        if not any(item["type"] in ("message", "function_call") for item in self.output) and (
                self.current is None or self.current["type"] != "message"):
            yield from self._open("message")  # an empty answer is still a message
        yield from self._close()
        self.response["usage"] = {
            "input_tokens": usage["prompt_tokens"],
            "input_tokens_details": {"cached_tokens": usage.get("cached_tokens", 0)},
            "output_tokens": usage["completion_tokens"], "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": usage["prompt_tokens"] + usage["completion_tokens"],
        }
        if self.finish_reason == "length":
            self.status = "incomplete"
            self.response["incomplete_details"] = {"reason": "max_output_tokens"}
            yield self._event("response.incomplete", response=self._snapshot())
        else:
            self.status = "completed"
            yield self._event("response.completed", response=self._snapshot())


async def response_events(builder: ResponseBuilder, stream: GenerationStream,
                          on_done=None) -> AsyncIterator[dict]:
    """The whole event sequence of one response, from the worker's deltas; `on_done(response)` at the end."""
    for event in builder.start():
        yield event
    usage: Usage = {"prompt_tokens": 0, "completion_tokens": 0}
    async for event in stream.events():
        for delta in event.get("choices", ()):
            for out in builder.delta(delta):
                yield out
        usage = event.get("usage", usage)
    for event in builder.finish(usage):
        if on_done is not None and event["type"] in ("response.completed", "response.incomplete"):
            await on_done(event["response"])
        yield event


async def collect_response(builder: ResponseBuilder, stream: GenerationStream) -> dict:
    """The final response object of a whole (non-streamed) answer."""
    answer = await stream.collect()
    # The same event sequence over the joined answer; its last event carries the final response.
    events = [*builder.start(), *(e for choice in answer.choices for e in builder.delta(choice)),
              *builder.finish(answer.usage)]
    return events[-1]["response"]


def builder_for(serializer, request_id: str, model: str) -> ResponseBuilder:
    return ResponseBuilder(request_id, model, serializer.validated_data)
