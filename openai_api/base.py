"""What every OpenAI endpoint view shares: async DRF, size limit, SSE framing."""
from __future__ import annotations

import json
from collections.abc import AsyncIterator

from adrf.views import APIView
from django.conf import settings
from django.http import StreamingHttpResponse

from .errors import APIError, error_body
from .generation import GenerationStream


class OpenAIView(APIView):
    """Async DRF view; bodies over the configured limit get 413 before parsing."""

    def initial(self, request, *args, **kwargs):
        limit = settings.INFERENCE["MAX_REQUEST_BYTES"]
        try:
            declared = int(request.META.get("CONTENT_LENGTH") or 0)
        except ValueError:
            declared = 0
        if declared > limit or len(request._request.body) > limit:
            raise APIError(413, f"Request body too large: the limit is {limit} bytes.", code="request_too_large")
        super().initial(request, *args, **kwargs)

    def serializer_context(self) -> dict:
        config = settings.INFERENCE
        return {"max_n": config["MAX_N"], "max_prompts": config["MAX_PROMPTS"]}


def sse_frame(payload: dict | str) -> bytes:
    data = payload if isinstance(payload, str) else json.dumps(payload, separators=(",", ":"), ensure_ascii=False)
    return f"data: {data}\n\n".encode()


def sse_response(chunks: AsyncIterator[dict], stream: GenerationStream) -> StreamingHttpResponse:
    """Frame chunks as SSE, end with [DONE]; a vanished client cancels the job at once."""

    async def body() -> AsyncIterator[bytes]:
        # An SSE comment first, so the status and headers reach the client at once even
        # while the job waits in the queue (SSE clients ignore comment lines).
        yield b": accepted\n\n"
        try:
            async for chunk in chunks:
                yield sse_frame(chunk)
        except APIError as exc:
            yield sse_frame(error_body(exc.status, exc.message, exc.param, exc.code))
        finally:
            await stream.cancel()
        yield sse_frame("[DONE]")

    response = StreamingHttpResponse(body(), content_type="text/event-stream")
    response["Cache-Control"] = "no-cache"
    response["X-Accel-Buffering"] = "no"
    return response
