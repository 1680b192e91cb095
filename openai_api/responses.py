"""`POST /v1/responses`: the Responses API over the same chat job, stateless.

One state machine (`ResponseBuilder`) turns parsed pieces into output items and the OpenAI
event sequence; the non-streamed answer is the final `response` of that same sequence.
"""
from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator, Iterator

from rest_framework.response import Response

from protocol import ChoiceDelta, Usage

from .base import GenerationView, sse_response
from .generation import GenerationStream, new_request_id
from .output_parsing import OutputParser, Piece
from .serializers.responses import ResponsesRequestSerializer
from .shaping import parser_for


def item_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


class ResponseBuilder:
    """Output items and events of one response; `events()` yields them in OpenAI's order."""

    def __init__(self, response_id: str, model: str, data: dict, parser: OutputParser) -> None:
        self.parser = parser
        self.sequence = 0
        self.output: list[dict] = []
        self.current: dict | None = None  # the open reasoning or message item
        self.status = "in_progress"
        self.finish_reason: str | None = None
        self.response = {
            "id": response_id, "object": "response", "created_at": int(time.time()), "status": "in_progress",
            "model": model, "output": self.output, "error": None, "incomplete_details": None,
            "instructions": data.get("instructions"), "max_output_tokens": data.get("max_output_tokens"),
            "temperature": data.get("temperature"), "top_p": data.get("top_p"),
            "tools": data.get("tools") or [], "tool_choice": data.get("tool_choice") or "auto",
            "parallel_tool_calls": data.get("parallel_tool_calls", True) is not False,
            "previous_response_id": None, "store": False, "metadata": data.get("metadata") or {},
            "text": {"format": {"type": (data.get("response_format") or {}).get("type", "text")}},
            "usage": None, "user": data.get("user"),
        }

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
        index, part = self.output.index(item), item["content"][0]
        common = {"item_id": item["id"], "output_index": index, "content_index": 0}
        if item["type"] == "reasoning":
            yield self._event("response.reasoning_text.done", text=part["text"], **common)
        else:
            yield self._event("response.output_text.done", text=part["text"], logprobs=[], **common)
        yield self._event("response.content_part.done", part=dict(part), **common)
        item["status"] = "completed"
        yield self._event("response.output_item.done", output_index=index, item=item)

    def delta(self, delta: ChoiceDelta) -> Iterator[dict]:
        """The events of one step's text (and of the parser's end, on the last step)."""
        pieces = self.parser.feed(delta["text"])
        if delta["finish_reason"]:
            self.finish_reason = delta["finish_reason"]
            pieces += self.parser.finish()
        yield from self.pieces(pieces)

    def pieces(self, pieces: list[Piece]) -> Iterator[dict]:
        for piece in pieces:
            if piece.kind == "tool_call":
                yield from self._function_call(piece)
                continue
            if self.current is None or self.current["type"] != ("reasoning" if piece.kind == "reasoning" else "message"):
                yield from self._open(piece.kind)
            item = self.current
            item["content"][0]["text"] += piece.text
            common = {"item_id": item["id"], "output_index": len(self.output) - 1, "content_index": 0}
            if piece.kind == "reasoning":
                yield self._event("response.reasoning_text.delta", delta=piece.text, **common)
            else:
                yield self._event("response.output_text.delta", delta=piece.text, logprobs=[], **common)

    def _function_call(self, piece: Piece) -> Iterator[dict]:
        yield from self._close()
        call, index = piece.tool_call, len(self.output)
        item = {"type": "function_call", "id": item_id("fc"), "call_id": call.id, "name": call.name,
                "arguments": "", "status": "in_progress"}
        self.output.append(item)
        yield self._event("response.output_item.added", output_index=index, item=dict(item))
        yield self._event("response.function_call_arguments.delta", item_id=item["id"], output_index=index,
                          delta=call.arguments)
        item["arguments"] = call.arguments
        yield self._event("response.function_call_arguments.done", item_id=item["id"], output_index=index,
                          name=call.name, arguments=call.arguments)
        item["status"] = "completed"
        yield self._event("response.output_item.done", output_index=index, item=dict(item))

    def finish(self, usage: Usage) -> Iterator[dict]:
        if not any(item["type"] in ("message", "function_call") for item in self.output) and (
                self.current is None or self.current["type"] != "message"):
            yield from self._open("message")  # an empty answer is still a message
        yield from self._close()
        self.response["usage"] = {
            "input_tokens": usage["prompt_tokens"], "input_tokens_details": {"cached_tokens": 0},
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


async def response_events(builder: ResponseBuilder, stream: GenerationStream) -> AsyncIterator[dict]:
    """The whole event sequence of one response, from the worker's deltas."""
    for event in builder.start():
        yield event
    usage: Usage = {"prompt_tokens": 0, "completion_tokens": 0}
    async for event in stream.events():
        for delta in event.get("choices", ()):
            for out in builder.delta(delta):
                yield out
        usage = event.get("usage", usage)
    for event in builder.finish(usage):
        yield event


class ResponsesView(GenerationView):
    serializer_class = ResponsesRequestSerializer

    def new_request_id(self) -> str:
        return new_request_id("resp").replace("-", "_")

    async def respond(self, serializer, request_id: str, model: str, stream: GenerationStream):
        data = serializer.validated_data
        if data["stream"]:
            parser = parser_for((stream.started.get("open_blocks") or [""])[0], serializer.parse_tools)
            builder = ResponseBuilder(request_id, model, data, parser)
            return sse_response(response_events(builder, stream), stream)
        return Response(await self.whole_body(serializer, request_id, model, stream))

    async def whole_body(self, serializer, request_id: str, model: str, stream: GenerationStream) -> dict:
        parser = parser_for((stream.started.get("open_blocks") or [""])[0], serializer.parse_tools)
        builder = ResponseBuilder(request_id, model, serializer.validated_data, parser)
        answer = await stream.collect()
        # The same event sequence over the joined answer; its last event carries the final response.
        events = [*builder.start(), *(e for choice in answer.choices for e in builder.delta(choice)),
                  *builder.finish(answer.usage)]
        return events[-1]["response"]
