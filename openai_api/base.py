"""What every OpenAI endpoint view shares: async DRF, size limit, SSE framing, the generation pipeline."""
from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, replace
from typing import Literal

import orjson
from adrf.views import APIView
from channels.db import database_sync_to_async
from django.conf import settings
from django.http import HttpResponseBase, StreamingHttpResponse
from rest_framework.response import Response

from catalog.hf_cache import cached_served_models_now
from catalog.selectors import resolve_model as resolve_catalog_model, resolve_model_now
import protocol
from teams.metering import RequestMeter, record_unmetered
from teams.principal import Principal
from teams.authentication import LookupOnLongLivedThread
from teams.response_headers import RateLimitHeadersMixin

from .errors import APIError, client_error, error_body, in_request_terms
from .generation import GenerationStream, new_request_id, open_generation

logger = logging.getLogger(__name__)
PriorityClass = Literal["interactive", "batch"]


class OpenAIView(RateLimitHeadersMixin, LookupOnLongLivedThread, APIView):
    """Async DRF view; bodies over the configured limit get 413 before parsing. Every response
    to an authenticated request carries OpenAI's x-ratelimit-* headers (`teams.response_headers`)."""

    buffers_body = True  # False: a view that streams its (multipart) body itself, bounded by `body_limit`

    def body_limit(self, request) -> int:
        return settings.INFERENCE.api.max_request_bytes

    def initial(self, request, *args, **kwargs):
        limit = self.body_limit(request)
        try:
            declared = int(request.META.get("CONTENT_LENGTH") or 0)
        except ValueError:
            declared = 0
        # The body is read (and kept) before authentication: session auth's CSRF check may read the
        # request's stream, after which Django no longer gives the body.
        too_large = declared > limit or (self.buffers_body and len(request._request.body) > limit)
        self.perform_authentication(request)  # before the 413, so that it carries the caller's rate-limit headers
        if too_large:
            raise APIError(413, f"Request body too large: the limit is {limit} bytes.", code="request_too_large")
        super().initial(request, *args, **kwargs)

    def serializer_context(self) -> dict:
        return serializer_context()

    def finalize_response(self, request, response, *args, **kwargs):
        response = super().finalize_response(request, response, *args, **kwargs)
        if type(response) is Response:
            response.__class__ = RenderedOnLoop
        return response


class RenderedOnLoop(Response):
    """DRF's Response, rendered on the event loop: Django's async handler awaits a coroutine `render` and hands
    any other to the request's thread (that thread woken, then the loop woken back: one of the four hand-offs a
    small request made). Rendering is encoding JSON, which every SSE frame does on the loop already."""

    async def render(self):
        return Response.render(self)


def serializer_context() -> dict:
    """The server's request limits, as serializers read them from their context."""
    config = settings.INFERENCE.api
    return {"max_n": config.max_n, "max_prompts": config.max_prompts, "max_beams": config.max_beams,
            "max_logprobs": config.max_logprobs,
            "max_schema_bytes": config.max_schema_bytes, "max_schema_depth": config.max_schema_depth,
            "request_defaults": {"seed": config.default_seed, "stop": config.stop_sequences,
                                 "ignore_eos": config.ignore_eos}}


def sse_frame(payload: dict | str) -> bytes:
    """One SSE event. orjson, not json: a streamed token's chunk took 4 µs to encode, now 0.3 (and a float
    that is not finite becomes null, valid JSON, where json wrote NaN). What orjson refuses (an integer past
    64 bits, as a client's JSON schema may hold and a response's events echo) goes through json."""
    if isinstance(payload, str):
        return f"data: {payload}\n\n".encode()
    try:
        data = orjson.dumps(payload, option=orjson.OPT_NON_STR_KEYS)
    except TypeError:
        data = json.dumps(payload, separators=(",", ":"), ensure_ascii=False).encode()
    return b"data: " + data + b"\n\n"


SSE_KEEPALIVE = b": keepalive\n\n"


async def keepalives_until_first(chunks: AsyncIterator[dict], every: float) -> AsyncIterator[dict | None]:
    """`chunks`, with a None every `every` seconds while the first one is awaited.

    A job waits before its first token (queued behind running sequences, or sent again after
    its worker died), and a client hearing nothing for that long cannot tell a queue from a hang.
    After the first chunk the worker answers every step, so the rest passes straight through.
    """
    iterator = aiter(chunks)
    first = asyncio.ensure_future(anext(iterator))
    try:
        while not (await asyncio.wait({first}, timeout=every))[0]:
            yield None
    finally:
        if not first.done():  # the client went away while waiting: stop the job's iterator too
            first.cancel()
    try:
        yield first.result()
    except StopAsyncIteration:
        return
    async for chunk in iterator:
        yield chunk


def sse_response(chunks: AsyncIterator[dict], stream: GenerationStream) -> StreamingHttpResponse:
    """Frame chunks as SSE, end with [DONE]; a vanished client cancels the job at once."""

    async def body() -> AsyncIterator[bytes]:
        stream.claimed = True  # from here, this body's `finally` ends the job, however the client leaves
        # An SSE comment first, so the status and headers reach the client at once even
        # while the job waits in the queue (SSE clients ignore comment lines); more while it waits.
        stream.responding = True
        if stream.meter is not None:
            stream.meter.response_started()
        yield b": accepted\n\n"
        try:
            async for chunk in keepalives_until_first(chunks, settings.INFERENCE.jobs.sse_keepalive_seconds):
                yield SSE_KEEPALIVE if chunk is None else sse_frame(chunk)
        except Exception as exc:  # mid-stream, every error is an OpenAI-shaped event, then [DONE]
            error = client_error(exc)
            if error.status == 500 and error.code == "internal_error":
                logger.exception("stream failed")
            stream.error = stream.error or error  # what the ledger row records
            yield sse_frame(error_body(error.status, error.message, error.param, error.code, error.error_type))
        finally:
            try:
                await stream.cancel()
            except Exception:  # settling failed (logged): the client still gets the end of its stream
                logger.exception("settling the stream of %s failed", stream.request_id)
        yield sse_frame("[DONE]")

    response = StreamingHttpResponse(body(), content_type="text/event-stream")
    response["Cache-Control"] = "no-cache"
    response["X-Accel-Buffering"] = "no"
    return response


async def resolve_model(name: str) -> protocol.ModelRef:
    """The name a job carries for a client's model name (catalog errors become 404s in errors.py).

    On the event loop when the catalog's kept rules and scan answer it (catalog/snapshots.py); else in a
    worker thread of its own (thread_sensitive=False), so a slow catalog read never queues behind
    another request's.
    """
    resolved = resolve_model_now(name)
    if resolved is not None:
        return resolved
    return await database_sync_to_async(resolve_catalog_model, thread_sensitive=False)(name)


TASK_ENDPOINTS = {"generate": "/v1/chat/completions, /v1/completions or /v1/responses",
                  "transcribe": "/v1/audio/transcriptions or /v1/audio/translations",
                  "embed": "/v1/embeddings", "score": "/v1/score or /v1/rerank"}


def refuse_other_task(model: protocol.ModelRef, task: str | None) -> None:
    """A model that cannot do this endpoint's task (a chat request to a Whisper) is a 400 before anything is
    loaded, naming what it does do; the kept cache scan answers it (a model it does not hold: the worker)."""
    entries = cached_served_models_now() if task else None
    entry = next((m for m in entries or () if m.repo_id == model.repo_id), None)
    if entry is None or not entry.tasks or task in entry.tasks:
        return
    where = "; ".join(TASK_ENDPOINTS.get(own, own) for own in entry.tasks)
    raise APIError(400, f"{model.repo_id} cannot {task} (it does: {', '.join(entry.tasks)}); send it to {where}.",
                   "model", "unsupported_model")


class GenerationView(OpenAIView):
    """validate -> resolve the model -> meter it -> open the generation -> shape the answer.

    A subclass names its `serializer_class` (with `job_prompts()` and `job_params()`, the
    request as a job) and `id_prefix`, and implements `respond()`; `answer_without_job()`
    may answer a request that needs no generation. The meter (`teams.metering`) refuses a model
    the caller's team or key may not use (404), admits the job against the team's limits, and
    settles it and writes its ledger row when the stream closes; its counters give the
    response's rate-limit headers, errors included.
    """

    serializer_class: type
    id_prefix: str
    model_task: str | None = None  # what the model must do (protocol.modalities.model_tasks); None: the worker checks

    async def post(self, request) -> HttpResponseBase:
        return await self.generate(request, self.validated(request.data))

    def handle_exception(self, exc):
        """A 5xx before the request was metered (the database down at its key's lookup) still gets its
        ledger row: 5xx count as requests (docs/teams.md). 4xx before metering write none, by design."""
        response = super().handle_exception(exc)
        if response.status_code >= 500 and getattr(self.request, "meter", None) is None:
            error = (getattr(response, "data", None) or {}).get("error") or {}
            auth = getattr(self.request, "_auth", None)  # never `.auth`: it would authenticate again
            principal = auth if isinstance(auth, Principal) else None
            try:
                record_unmetered(self.new_request_id(), self.request.path, response.status_code,
                                 error.get("code") or "", principal,
                                 self.request.META.get("HTTP_AUTHORIZATION", "").encode("latin-1"))
            except Exception:  # the answer still goes out; the log says what was not recorded
                logger.exception("could not record the usage row of a refused request")
        return response

    def validated(self, body: dict):
        serializer = self.serializer_class(data=body, context=self.serializer_context())
        serializer.is_valid(raise_exception=True)
        return serializer

    async def generate(self, request, serializer) -> HttpResponseBase:
        """Everything after validation: the model, the meter, the job, the answer."""
        def meter_for(request_id: str) -> RequestMeter:
            request.meter = RequestMeter(request.auth, request.path, request_id, metered=self.metered(request))
            return request.meter

        job = await self.start(serializer, meter_for)
        if job.early is not None:
            return Response(job.early)
        return await self.respond(job.serializer, job.request_id, job.model, job.stream)

    async def start(self, serializer, meter_for: Callable[[str], RequestMeter],
                    priority_class: PriorityClass = "interactive") -> Job:
        """The pipeline from a validated request up to an open job; the batch runner
        (`openai_api.batches.lines`) shares it, at `batch` priority."""
        data = serializer.validated_data
        resolved = await resolve_model(data["model"])
        refuse_other_task(resolved, self.model_task)
        model = str(resolved)
        request_id = self.new_request_id()
        meter = meter_for(request_id)
        meter.check_model(model, data["model"])
        meter.tags = serializer.usage_tags() if hasattr(serializer, "usage_tags") else {}
        early = self.answer_without_job(data)
        if early is not None:
            return Job(serializer, request_id, model, None, early)
        params = serializer.job_params()
        if priority_class == "batch":  # a request may ask for batch itself (service_tier "flex"), never the reverse
            params = replace(params, priority_class="batch")
        try:
            stream = await open_generation(request_id, resolved, serializer.job_prompts(), params, meter)
        except APIError as exc:  # the worker's `prompt` / `max_tokens`, as this endpoint calls them
            raise in_request_terms(exc, serializer.job_field_names() if hasattr(serializer, "job_field_names")
                                   else {}) from None
        return Job(serializer, request_id, model, stream)

    def new_request_id(self) -> str:
        return new_request_id(self.id_prefix)

    def metered(self, request) -> bool:
        """Whether the request counts against the team's limits and is written to the ledger."""
        return True

    def answer_without_job(self, data: dict) -> dict | None:
        return None

    async def respond(self, serializer, request_id: str, model: str, stream: GenerationStream) -> HttpResponseBase:
        """The answer: its whole body (endpoints that stream override this)."""
        return Response(await self.whole_body(serializer, request_id, model, stream))

    async def whole_body(self, serializer, request_id: str, model: str, stream: GenerationStream) -> dict:
        """The non-streamed answer's body (a `stream: false` response, a batch line's `response.body`)."""
        raise NotImplementedError


@dataclass
class Job:
    """A request on its way: validated, metered, and either sent (`stream`) or answered at once (`early`)."""

    serializer: object
    request_id: str
    model: str
    stream: GenerationStream | None
    early: dict | None = None
