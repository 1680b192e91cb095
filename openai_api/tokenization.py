"""`POST /tokenize` and `POST /detokenize`: the worker's tokenizer and chat template, as vLLM serves them.

Both are zero-token jobs: the worker tokenizes (or renders) the prompt, reports its ids in the
`started` message, and finishes at once; detokenize reads the echoed text of a token-id prompt.
The chat page's context meter calls /tokenize as its user types: from a signed-in page (no key) it is
free of the team's rate limits and of the ledger, never of authentication or the team's model list.
"""
from __future__ import annotations

from rest_framework.response import Response

from .base import GenerationView
from .generation import GenerationStream
from .serializers.tokenize import DetokenizeRequestSerializer, TokenizeRequestSerializer


class TokenizeView(GenerationView):
    serializer_class = TokenizeRequestSerializer
    id_prefix = "tok"

    def metered(self, request) -> bool:
        return request.auth.key is not None  # a key's /tokenize counts; the signed-in page's does not

    async def respond(self, serializer, request_id: str, model: str, stream: GenerationStream):
        answer = await stream.collect()
        tokens = stream.started["prompt_token_ids"][0]
        body = {"tokens": tokens, "count": len(tokens), "max_model_len": stream.started.get("max_model_len")}
        if serializer.validated_data["return_token_strs"]:
            scored = (answer.choices[0].get("prompt_logprobs") if answer.choices else None) or []
            body["token_strs"] = [entry["token"] for entry in scored]
        return Response(body)


class DetokenizeView(GenerationView):
    serializer_class = DetokenizeRequestSerializer
    id_prefix = "detok"

    def metered(self, request) -> bool:
        return request.auth.key is not None  # as /tokenize: the playground's context fit spends no request quota

    def answer_without_job(self, data: dict) -> dict | None:
        return {"prompt": ""} if not data["tokens"] else None

    async def respond(self, serializer, request_id: str, model: str, stream: GenerationStream):
        answer = await stream.collect()
        return Response({"prompt": "".join(choice["text"] for choice in answer.choices)})


class TokenizeV1View(TokenizeView):
    """`POST /v1/tokenize` (forgather's path), the same as `/tokenize`."""


class DetokenizeV1View(DetokenizeView):
    """`POST /v1/detokenize`, the same as `/detokenize`."""
