"""`POST /tokenize` and `POST /detokenize`: the worker's tokenizer and chat template, as vLLM serves them.

Both are zero-token jobs: the worker tokenizes (or renders) the prompt, reports its ids in the
`started` message, and finishes at once; detokenize reads the echoed text of a token-id prompt.
"""
from __future__ import annotations

import dataclasses

from asgiref.sync import sync_to_async
from rest_framework.response import Response

from catalog.selectors import resolve_model_id
from workers.protocol import JobParams

from .base import OpenAIView
from .generation import GenerationStream, new_request_id, open_generation
from .serializers.tokenize import DetokenizeRequestSerializer, TokenizeRequestSerializer

ZERO_TOKEN_JOB = JobParams(max_tokens=0)


async def drain_text(stream: GenerationStream) -> str:
    """The job's whole text (for a zero-token job: just the echo)."""
    text = ""
    try:
        async for event in stream.events():
            text += "".join(delta["text"] for delta in event.get("choices", ()))
    finally:
        await stream.cancel()
    return text


class TokenizeView(OpenAIView):
    async def post(self, request):
        serializer = TokenizeRequestSerializer(data=request.data, context=self.serializer_context())
        serializer.is_valid(raise_exception=True)
        model = await sync_to_async(resolve_model_id)(serializer.validated_data["model"])
        stream = await open_generation(new_request_id("tok"), model, [serializer.job_prompt()], ZERO_TOKEN_JOB)
        await drain_text(stream)
        tokens = stream.started["prompt_token_ids"][0]
        return Response({"tokens": tokens, "count": len(tokens), "max_model_len": stream.started.get("max_model_len")})


class DetokenizeView(OpenAIView):
    async def post(self, request):
        serializer = DetokenizeRequestSerializer(data=request.data, context=self.serializer_context())
        serializer.is_valid(raise_exception=True)
        data = serializer.validated_data
        model = await sync_to_async(resolve_model_id)(data["model"])
        if not data["tokens"]:
            return Response({"prompt": ""})
        stream = await open_generation(new_request_id("detok"), model, [{"token_ids": data["tokens"]}],
                                     dataclasses.replace(ZERO_TOKEN_JOB, echo=True))
        return Response({"prompt": await drain_text(stream)})
