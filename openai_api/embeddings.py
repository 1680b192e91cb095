"""`POST /v1/embeddings`: OpenAI's Embeddings API over sentence-transformers models in the cache.

The worker pools each input (workers.engine.embedding) and answers once with every vector; here
they become OpenAI's list of `embedding` objects, as floats or as base64 of little-endian float32
(what the openai SDK sends for by default and decodes itself). Metered like any job: the inputs'
tokens count against the team's tokens, the request against its rpm.
"""
from __future__ import annotations

import base64
import struct

from rest_framework.response import Response

from .base import GenerationView
from .errors import APIError
from .generation import GenerationStream
from .serializers.embeddings import EmbeddingRequestSerializer, RerankRequestSerializer


def encode_vector(vector: list[float], encoding_format: str) -> list[float] | str:
    if encoding_format == "base64":
        return base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode("ascii")
    return vector


class EmbeddingsView(GenerationView):
    serializer_class = EmbeddingRequestSerializer
    id_prefix = "embd"

    async def respond(self, serializer, request_id: str, model: str, stream: GenerationStream):
        return Response(await self.whole_body(serializer, request_id, model, stream))

    async def whole_body(self, serializer, request_id: str, model: str, stream: GenerationStream) -> dict:
        answer = await stream.collect()
        encoding = serializer.validated_data["encoding_format"]
        data = []
        for choice in answer.choices:
            if "embedding" not in choice:
                raise APIError(500, "The worker answered without an embedding.", code="internal_error")
            data.append({"object": "embedding", "index": choice["index"],
                         "embedding": encode_vector(choice["embedding"], encoding)})
        prompt_tokens = (answer.usage or {}).get("prompt_tokens", 0)
        return {"object": "list", "data": data, "model": model,
                "usage": {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens}}


def cosine(a: list[float], b: list[float]) -> float:
    dot = sum(x * y for x, y in zip(a, b))
    norm = (sum(x * x for x in a) ** 0.5) * (sum(y * y for y in b) ** 0.5)
    return dot / norm if norm else 0.0


class RerankView(GenerationView):
    """`POST /v1/rerank` and `/rerank`: the documents ordered by the cosine similarity of their embedding to
    the query's (one embeddings job of query + documents); `results[].index/relevance_score/document`."""

    serializer_class = RerankRequestSerializer
    id_prefix = "rerank"

    async def respond(self, serializer, request_id: str, model: str, stream: GenerationStream):
        return Response(await self.whole_body(serializer, request_id, model, stream))

    async def whole_body(self, serializer, request_id: str, model: str, stream: GenerationStream) -> dict:
        data = serializer.validated_data
        answer = await stream.collect()
        vectors = [choice.get("embedding") for choice in answer.choices]
        if len(vectors) != len(data["documents"]) + 1 or any(v is None for v in vectors):
            raise APIError(500, "The worker answered without every embedding.", code="internal_error")
        query, documents = vectors[0], vectors[1:]
        results = [{"index": i, "relevance_score": cosine(query, vector)} for i, vector in enumerate(documents)]
        results.sort(key=lambda r: -r["relevance_score"])
        if data.get("top_n"):
            results = results[: data["top_n"]]
        if data["return_documents"]:
            for result in results:
                result["document"] = {"text": data["documents"][result["index"]]}
        tokens = (answer.usage or {}).get("prompt_tokens", 0)
        return {"id": request_id, "model": model, "results": results, "usage": {"total_tokens": tokens}}


class RerankAliasView(RerankView):
    """`POST /rerank` (Jina's and vLLM's path), the same as `/v1/rerank`."""
