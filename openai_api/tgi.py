"""Text Generation Inference's routes: `POST /generate`, `POST /generate_stream`, `POST /` and `GET /info`.

What `huggingface_hub.InferenceClient(base_url=...).text_generation(...)` (and scripts written for TGI)
send: `{"inputs", "parameters", "stream"}`. The request becomes a `/v1/completions` request (its
serializer validates it; `parameters.adapter_id` or the server's default model names the model), runs
through the same pipeline (keys, limits, meter), and is answered in TGI's shapes: `generated_text` with
`details` (finish reason, token ids, texts and logprobs) or, streamed, one `token` event per token, the
last carrying `generated_text` and `details`. Errors name TGI's fields (`parameters.max_new_tokens`,
`inputs`), never the completions request's they were validated as.
"""
from __future__ import annotations

from collections.abc import AsyncIterator

from django.conf import settings
from rest_framework import serializers
from rest_framework.response import Response

from .base import GenerationView, OpenAIView, resolve_model, sse_response
from .errors import APIError
from .generation import GenerationStream
from .serializers.completions import CompletionRequestSerializer

FINISH = {"length": "length", "stop": "eos_token"}
DEFAULT_MAX_NEW_TOKENS = 100
PASSED = ("temperature", "top_p", "top_k", "seed", "stop", "repetition_penalty", "frequency_penalty")
TGI_NAMES = {"max_tokens": "max_new_tokens", "echo": "return_full_text", "model": "adapter_id"}


def tgi_param(name: str) -> str:
    """Where a TGI body holds what the completions request calls `name`."""
    if name in ("prompt", "stream"):
        return "inputs" if name == "prompt" else name
    return "parameters." + TGI_NAMES.get(name, name)


def tgi_text(message: str) -> str:
    return message.replace("max_tokens", "max_new_tokens")


def completion_body(body, stream: bool | None = None) -> dict:
    """A TGI request as the /v1/completions request it means."""
    if not isinstance(body, dict) or not isinstance(body.get("inputs"), str):
        raise serializers.ValidationError({"inputs": ["inputs must be a string."]})
    parameters = body.get("parameters") or {}
    if not isinstance(parameters, dict):
        raise serializers.ValidationError({"parameters": ["parameters must be an object."]})
    given = {key: value for key, value in parameters.items() if value is not None}
    new_tokens = given.get("max_new_tokens")
    if isinstance(new_tokens, int) and not isinstance(new_tokens, bool) and new_tokens < 1:
        raise serializers.ValidationError({"parameters.max_new_tokens": ["max_new_tokens must be strictly positive."]})
    request = {"model": given.get("adapter_id") or settings.INFERENCE.models.default, "prompt": body["inputs"],
               "max_tokens": given.get("max_new_tokens", DEFAULT_MAX_NEW_TOKENS),
               "stream": bool(body.get("stream")) if stream is None else stream, "logprobs": 0,
               "echo": bool(given.get("return_full_text", False))}
    request.update({key: given[key] for key in PASSED if key in given and given[key] != []})
    sampling = given.get("do_sample") or any(key in given for key in ("temperature", "top_p", "top_k"))
    request.setdefault("temperature", 1.0 if sampling else 0.0)
    if not sampling:
        request["temperature"] = 0.0
    return request


def token_objects(delta: dict, eos: set[int]) -> list[dict]:
    logprobs = delta.get("logprobs") or {}
    texts = logprobs.get("tokens") or []
    values = logprobs.get("token_logprobs") or []
    ids = delta["token_ids"]
    skip = len(texts) - len(ids)  # echoed prompt tokens come first
    return [{"id": token_id, "text": texts[skip + i] if skip + i < len(texts) else "",
             "logprob": values[skip + i] if skip + i < len(values) else None, "special": token_id in eos}
            for i, token_id in enumerate(ids)]


class TGIGenerateView(GenerationView):
    serializer_class = CompletionRequestSerializer
    id_prefix = "tgi"
    stream: bool | None = False  # /generate: never; /generate_stream: always; /: as the body says
    as_list = False  # `POST /` answers a one-element list, as TGI does

    async def post(self, request):
        body = completion_body(request.data, self.stream)
        self.details = bool((request.data.get("parameters") or {}).get("details"))
        try:
            return await self.generate(request, self.validated(body))
        except APIError as exc:  # the worker's refusals (a prompt past the context) name TGI's fields too
            if exc.param in ("max_tokens", "prompt"):
                exc.param, exc.message = tgi_param(exc.param), tgi_text(exc.message)
            raise

    def validated(self, body: dict):
        try:
            return super().validated(body)
        except serializers.ValidationError as exc:
            if not isinstance(exc.detail, dict):
                raise
            raise serializers.ValidationError(
                {tgi_param(name): [tgi_text(str(m)) for m in messages] if isinstance(messages, list) else messages
                 for name, messages in exc.detail.items()}) from None

    async def respond(self, serializer, request_id: str, model: str, stream: GenerationStream):
        if serializer.validated_data["stream"]:
            return sse_response(self.events(stream, serializer.validated_data), stream)
        answer = await stream.collect()
        if not answer.choices:
            raise APIError(500, "The worker answered without a choice.", code="internal_error")
        choice = answer.choices[0]
        body: dict = {"generated_text": choice["text"]}
        if self.details:
            tokens = token_objects(choice, set())
            body["details"] = {"finish_reason": FINISH.get(choice["finish_reason"], "stop_sequence"),
                               "generated_tokens": len(choice["token_ids"]),
                               "seed": serializer.validated_data.get("seed"), "prefill": [], "tokens": tokens}
        return Response([body] if self.as_list else body)

    async def events(self, stream: GenerationStream, data: dict) -> AsyncIterator[dict]:
        text, count, index = "", 0, 0
        async for event in stream.events():
            for delta in event.get("choices", ()):
                text += delta["text"]
                tokens = token_objects(delta, set())
                for position, token in enumerate(tokens):
                    count += 1
                    last = delta["finish_reason"] is not None and position == len(tokens) - 1
                    details = ({"finish_reason": FINISH.get(delta["finish_reason"], "stop_sequence"),
                                "generated_tokens": count, "seed": data.get("seed")} if last else None)
                    yield {"index": index, "token": token, "top_tokens": None,
                           "generated_text": text if last else None, "details": details}
                    index += 1


class TGIStreamView(TGIGenerateView):
    stream = True


class TGIRootView(TGIGenerateView):
    stream = None
    as_list = True


class TGIInfoView(OpenAIView):
    async def get(self, request):
        model = str(await resolve_model(settings.INFERENCE.models.default))
        return Response({"model_id": model.split("@")[0], "model_sha": None, "model_dtype": None,
                         "model_device_type": None, "model_pipeline_tag": "text-generation",
                         "max_concurrent_requests": settings.INFERENCE.api.max_prompts,
                         "max_best_of": 1, "max_stop_sequences": 16, "max_input_tokens": None,
                         "max_total_tokens": None, "validation_workers": 1, "max_client_batch_size": 1,
                         "router": "text-generation-router", "version": "2.0.0", "sha": None,
                         "docker_label": None})
