"""`POST /v1/completions`: the legacy text-completions API, for base models."""
from __future__ import annotations

import time
from collections.abc import AsyncIterator

from rest_framework.response import Response

from protocol import ChoiceDelta

from .base import GenerationView, sse_response
from .generation import Collected, GenerationStream
from .serializers.completions import CompletionRequestSerializer
from .shaping import usage_body


class CompletionShaper:
    """Turns worker deltas into OpenAI `text_completion` objects, streamed or whole."""

    def __init__(self, request_id: str, model: str, options: dict) -> None:
        self.base = {"id": request_id, "object": "text_completion", "created": int(time.time()), "model": model}
        self.with_logprobs = options.get("logprobs") is not None
        self.with_token_ids = options.get("return_token_ids", False)
        self.include_usage = bool((options.get("stream_options") or {}).get("include_usage"))

    def _choice(self, delta: ChoiceDelta) -> dict:
        choice = {
            "index": delta["index"],
            "text": delta["text"],
            "logprobs": delta["logprobs"] if self.with_logprobs else None,
            "finish_reason": delta["finish_reason"],
        }
        if self.with_token_ids:
            choice["token_ids"] = delta["token_ids"]
        return choice

    def _worth_sending(self, delta: ChoiceDelta) -> bool:
        """A step whose token added no visible text yet (held back) makes no chunk."""
        return bool(
            delta["text"] or delta["finish_reason"]
            or (self.with_logprobs and delta["logprobs"] and delta["logprobs"]["tokens"])
            or (self.with_token_ids and delta["token_ids"])
        )

    async def chunks(self, stream: GenerationStream) -> AsyncIterator[dict]:
        extra = {"usage": None} if self.include_usage else {}
        if self.with_token_ids:
            extra["prompt_token_ids"] = stream.started.get("prompt_token_ids")
        async for event in stream.events():
            for delta in event.get("choices", ()):
                if self._worth_sending(delta):
                    yield {**self.base, "choices": [self._choice(delta)], **extra}
            if self.include_usage and "usage" in event:
                yield {**self.base, "choices": [], "usage": usage_body(event["usage"])}

    def body(self, answer: Collected, started: dict) -> dict:
        body = {**self.base, "choices": [self._choice(choice) for choice in answer.choices],
                "usage": usage_body(answer.usage)}
        if self.with_token_ids:
            body["prompt_token_ids"] = started.get("prompt_token_ids")
        return body


class CompletionsView(GenerationView):
    serializer_class = CompletionRequestSerializer
    id_prefix = "cmpl"

    async def respond(self, serializer, request_id: str, model: str, stream: GenerationStream):
        data = serializer.validated_data
        shaper = CompletionShaper(request_id, model, data)
        if data["stream"]:
            return sse_response(shaper.chunks(stream), stream)
        return Response(await self.whole_body(serializer, request_id, model, stream))

    async def whole_body(self, serializer, request_id: str, model: str, stream: GenerationStream) -> dict:
        shaper = CompletionShaper(request_id, model, serializer.validated_data)
        return shaper.body(await stream.collect(), stream.started)
