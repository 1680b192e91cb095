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
from .vllm_shapes import RunningUsage, prompt_logprobs_body


class CompletionShaper:
    """Turns worker deltas into OpenAI `text_completion` objects, streamed or whole.

    vLLM's extras go where vLLM puts them: `prompt_token_ids` (flat, the choice's own prompt) and
    `prompt_logprobs` on each choice, in a stream on its first chunk only.
    """

    def __init__(self, request_id: str, model: str, options: dict, started: dict) -> None:
        self.base = {"id": request_id, "object": "text_completion", "created": int(time.time()), "model": model}
        self.n = options.get("n", 1)
        self.with_logprobs = options.get("logprobs") is not None
        self.with_token_ids = options.get("return_token_ids", False)
        self.with_prompt_logprobs = options.get("prompt_logprobs") is not None
        stream_options = options.get("stream_options") or {}
        self.include_usage = bool(stream_options.get("include_usage"))
        self.continuous_usage = self.include_usage and bool(stream_options.get("continuous_usage_stats"))
        self.prompt_token_ids = started.get("prompt_token_ids") or []
        self.usage = RunningUsage(sum(started.get("prompt_tokens") or ()))
        self.opened: set[int] = set()  # choices whose first chunk went out

    def _choice(self, delta: ChoiceDelta) -> dict:
        first = delta["index"] not in self.opened
        self.opened.add(delta["index"])
        choice = {
            "index": delta["index"],
            "text": delta["text"],
            "logprobs": delta["logprobs"] if self.with_logprobs else None,
            "finish_reason": delta["finish_reason"],
        }
        if self.with_token_ids:
            if first:
                choice["prompt_token_ids"] = self.prompt_token_ids[delta["index"] // self.n]
            choice["token_ids"] = delta["token_ids"]
        if self.with_prompt_logprobs and first:
            choice["prompt_logprobs"] = prompt_logprobs_body(delta.get("prompt_logprobs"))
        return choice

    def _worth_sending(self, delta: ChoiceDelta) -> bool:
        """A step whose token added no visible text yet (held back) makes no chunk."""
        return bool(
            delta["text"] or delta["finish_reason"]
            or (self.with_logprobs and delta["logprobs"] and delta["logprobs"]["tokens"])
            or (self.with_token_ids and delta["token_ids"])
            or (self.with_prompt_logprobs and delta["index"] not in self.opened)
        )

    async def chunks(self, stream: GenerationStream) -> AsyncIterator[dict]:
        for_usage = {"usage": None} if self.include_usage else {}
        async for event in stream.events():
            for delta in event.get("choices", ()):
                self.usage.add(delta["token_ids"])
                if self._worth_sending(delta):
                    if self.continuous_usage:
                        for_usage = {"usage": self.usage.body()}
                    yield {**self.base, "choices": [self._choice(delta)], **for_usage}
            if self.include_usage and "usage" in event:
                yield {**self.base, "choices": [], "usage": usage_body(event["usage"])}

    def body(self, answer: Collected) -> dict:
        return {**self.base, "choices": [self._choice(choice) for choice in answer.choices],
                "usage": usage_body(answer.usage)}


class CompletionsView(GenerationView):
    serializer_class = CompletionRequestSerializer
    id_prefix = "cmpl"
    model_task = "generate"

    async def respond(self, serializer, request_id: str, model: str, stream: GenerationStream):
        data = serializer.validated_data
        shaper = CompletionShaper(request_id, model, data, stream.started)
        if data["stream"]:
            return sse_response(shaper.chunks(stream), stream)
        return Response(await self.whole_body(serializer, request_id, model, stream))

    async def whole_body(self, serializer, request_id: str, model: str, stream: GenerationStream) -> dict:
        shaper = CompletionShaper(request_id, model, serializer.validated_data, stream.started)
        return shaper.body(await stream.collect())
