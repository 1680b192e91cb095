"""`POST /v1/embeddings`: OpenAI's Embeddings API over sentence-transformers models in the cache.

The worker pools each input (workers.engine.tasks.embedding) and answers once with every vector; here
they become OpenAI's list of `embedding` objects, as floats or as base64 of little-endian float32
(what the openai SDK sends for by default and decodes itself). Metered like any job: the inputs'
tokens count against the team's tokens, the request against its rpm.
"""
from __future__ import annotations

import base64
import struct


from .base import GenerationView
from .errors import APIError
from .generation import GenerationStream
from .serializers.embeddings import EmbeddingRequestSerializer


def encode_vector(vector: list[float], encoding_format: str) -> list[float] | str:
    if encoding_format == "base64":
        return base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode("ascii")
    return vector


class EmbeddingsView(GenerationView):
    serializer_class = EmbeddingRequestSerializer
    id_prefix = "embd"

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
