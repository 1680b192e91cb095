"""`POST /v1/score` and `POST /v1/rerank` (vLLM's, Cohere's and Jina's): a score per text pair.

Both send one job of text pairs; the worker (workers.engine.tasks.pair_scoring) answers one `score` per
pair — a cross-encoder's (sigmoid of its) logit, or an embedding model's cosine similarity of the two
texts. Score answers them in vLLM's list of `score` objects; rerank orders the documents by them.
Served where vLLM serves them: `/score` and `/v1/score`; `/rerank`, `/v1/rerank` and `/v2/rerank`.
Metered like any job: the pairs' tokens count against the team's tokens, the request against its rpm.
"""
from __future__ import annotations

import time


from .base import GenerationView
from .errors import APIError
from .generation import Collected, GenerationStream
from .serializers.score import RerankRequestSerializer, ScoreRequestSerializer


def scores(answer: Collected, count: int) -> list[float]:
    """The worker's score for each of the `count` pairs, in order."""
    values = [choice.get("score") for choice in answer.choices]
    if len(values) != count or any(value is None for value in values):
        raise APIError(500, "The worker answered without a score for every pair.", code="internal_error")
    return values


class ScoreView(GenerationView):
    """`POST /v1/score`: `data[].index/object/score`, one per pair, in the pairs' order."""

    serializer_class = ScoreRequestSerializer
    id_prefix = "score"

    async def whole_body(self, serializer, request_id: str, model: str, stream: GenerationStream) -> dict:
        answer = await stream.collect()
        values = scores(answer, len(serializer.validated_data["pairs"]))
        tokens = (answer.usage or {}).get("prompt_tokens", 0)
        return {"id": request_id, "object": "list", "created": int(time.time()), "model": model,
                "data": [{"index": index, "object": "score", "score": value} for index, value in enumerate(values)],
                "usage": {"prompt_tokens": tokens, "total_tokens": tokens, "completion_tokens": 0}}


class ScoreAliasView(ScoreView):
    """`POST /score` (vLLM's own path), the same as `/v1/score`."""


class RerankView(GenerationView):
    """`POST /v1/rerank`: `results[].index/relevance_score/document`, best first, the first `top_n`."""

    serializer_class = RerankRequestSerializer
    id_prefix = "rerank"

    async def whole_body(self, serializer, request_id: str, model: str, stream: GenerationStream) -> dict:
        data = serializer.validated_data
        answer = await stream.collect()
        values = scores(answer, len(data["documents"]))
        results = sorted(({"index": index, "relevance_score": value} for index, value in enumerate(values)),
                         key=lambda result: -result["relevance_score"])
        if data.get("top_n"):
            results = results[: data["top_n"]]
        if data["return_documents"]:
            for result in results:
                result["document"] = {"text": data["documents"][result["index"]]}
        tokens = (answer.usage or {}).get("prompt_tokens", 0)
        return {"id": request_id, "model": model, "results": results,
                "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}


class RerankAliasView(RerankView):
    """`POST /rerank` (Jina's and vLLM's path), the same as `/v1/rerank`."""


class RerankV2View(RerankView):
    """`POST /v2/rerank` (Cohere's v2 path), the same as `/v1/rerank`."""
