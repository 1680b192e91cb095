"""`POST /v1/completions`: the legacy text-completions API, for base models."""
from __future__ import annotations

import time
from collections.abc import AsyncIterator

from asgiref.sync import sync_to_async
from rest_framework.response import Response

from catalog.selectors import resolve_model_id

from .base import OpenAIView, sse_response
from .generation import GenerationStream, new_request_id, open_generation
from .serializers.completions import CompletionRequestSerializer


def usage_body(usage: dict) -> dict:
    return {
        "prompt_tokens": usage["prompt_tokens"],
        "completion_tokens": usage["completion_tokens"],
        "total_tokens": usage["prompt_tokens"] + usage["completion_tokens"],
    }


class CompletionShaper:
    """Turns worker deltas into OpenAI `text_completion` objects, streamed or whole."""

    def __init__(self, request_id: str, model: str, options: dict) -> None:
        self.base = {"id": request_id, "object": "text_completion", "created": int(time.time()), "model": model}
        self.with_logprobs = options.get("logprobs") is not None
        self.with_token_ids = options.get("return_token_ids", False)
        self.include_usage = bool((options.get("stream_options") or {}).get("include_usage"))

    def _choice(self, delta: dict) -> dict:
        choice = {
            "index": delta["index"],
            "text": delta["text"],
            "logprobs": delta["logprobs"] if self.with_logprobs else None,
            "finish_reason": delta["finish_reason"],
        }
        if self.with_token_ids:
            choice["token_ids"] = delta["token_ids"]
        return choice

    def _worth_sending(self, delta: dict) -> bool:
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

    async def body(self, stream: GenerationStream) -> dict:
        merged, usage = await collect_choices(stream)
        body = {**self.base, "choices": [self._choice(merged[i]) for i in sorted(merged)], "usage": usage_body(usage)}
        if self.with_token_ids:
            body["prompt_token_ids"] = stream.started.get("prompt_token_ids")
        return body


async def collect_choices(stream: GenerationStream) -> tuple[dict[int, dict], dict]:
    """Every choice's deltas joined (the non-streamed answer), and the usage; cancels if cut short."""
    merged: dict[int, dict] = {}
    usage = None
    try:
        async for event in stream.events():
            for delta in event.get("choices", ()):
                merge_delta(merged, delta)
            usage = event.get("usage", usage)
    finally:
        await stream.cancel()
    return merged, usage


def merge_delta(merged: dict[int, dict], delta: dict) -> None:
    """Accumulate one choice's deltas: the non-streamed answer is the streamed one joined."""
    current = merged.get(delta["index"])
    if current is None:
        merged[delta["index"]] = {**delta, "token_ids": list(delta["token_ids"]),
                                  "logprobs": _copy_logprobs(delta["logprobs"])}
        return
    current["text"] += delta["text"]
    current["token_ids"].extend(delta["token_ids"])
    current["finish_reason"] = delta["finish_reason"] or current["finish_reason"]
    if delta["logprobs"] is not None:
        if current["logprobs"] is None:
            current["logprobs"] = _copy_logprobs(delta["logprobs"])
        else:
            for key, values in delta["logprobs"].items():
                current["logprobs"][key].extend(values)


def _copy_logprobs(logprobs: dict | None) -> dict | None:
    return None if logprobs is None else {key: list(values) for key, values in logprobs.items()}


class CompletionsView(OpenAIView):
    async def post(self, request):
        serializer = CompletionRequestSerializer(data=request.data, context=self.serializer_context())
        serializer.is_valid(raise_exception=True)
        data = serializer.validated_data
        model = await sync_to_async(resolve_model_id, thread_sensitive=False)(data["model"])
        request_id = new_request_id("cmpl")
        stream = await open_generation(request_id, model, data["prompt"], serializer.job_params())
        shaper = CompletionShaper(request_id, model, data)
        if data["stream"]:
            return sse_response(shaper.chunks(stream), stream)
        return Response(await shaper.body(stream))
