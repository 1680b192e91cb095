"""Pair scores for /v1/score and /v1/rerank: one number per (text_1, text_2) pair, as vLLM's score API gives.

Two kinds of model score pairs:

- a cross-encoder (`protocol.modalities`: a `*ForSequenceClassification` repo with one label, such as
  `cross-encoder/ms-marco-MiniLM-L-6-v2`): the pair goes in as the tokenizer's text pair
  (`tokenizer(text_1, text_2)`, truncated to the model's length, token types included) and its logit
  comes out through the repo's activation — `config.json`'s `sentence_transformers.activation_fn` where
  it names one (sigmoid or identity), else sigmoid (`pooling.read_classifier`). That is what sentence-transformers'
  `CrossEncoder.predict` returns and what vLLM's score returns by default; a request's
  `use_activation: false` gets the raw logit, as in vLLM.
- an embedding model: the cosine similarity of the two texts' pooled vectors (as vLLM scores with an
  embedding model), each distinct text embedded once and truncated to the model's length as
  `SentenceTransformer.encode` does.

Both are `embedding.PooledJob`s: their rows ride the batched forwards of `advance_embeddings`, beside
/v1/embeddings inputs of the same model. Each pair's number goes out as the `score` of its ChoiceDelta.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from protocol import ChoiceDelta, PairPrompt, SubmitMessage
from workers.engine.tasks.embedding import EmbeddingJob, PooledJob
from workers.engine.errors import JobError
from workers.engine.models.model_loader import LoadedModel

def is_pair_prompt(prompt) -> bool:
    return isinstance(prompt, dict) and "pair" in prompt


def pair_job(job: SubmitMessage, model: LoadedModel) -> PooledJob:
    """The job that scores `job`'s pairs on `model`: a cross-encoder's, or an embedding model's cosine."""
    if model.kind == "cross_encoder":
        return CrossEncoderJob(job, model)
    if model.kind == "embedding" and model.pooling is not None:
        return EmbeddingScoreJob(job, model)
    raise JobError(400, f"The model `{model.model_id}` does not score text pairs: /v1/score and /v1/rerank take "
                   "a cross-encoder (a sequence-classification model) or an embedding model.", "model",
                   "unsupported_model")


def score_delta(index: int, score: float) -> ChoiceDelta:
    return {"index": index, "text": "", "token_ids": [], "logprobs": None, "finish_reason": "stop", "score": score}


class CrossEncoderJob(PooledJob):
    """Each pair tokenized as one text pair at admission; its logit (through the activation) is its score."""

    def __init__(self, job: SubmitMessage, model: LoadedModel) -> None:
        super().__init__(job, model)
        prompts: list[PairPrompt] = job["prompts"]
        self.sigmoid = model.classifier.sigmoid and all(prompt.get("activation") is not False for prompt in prompts)
        self.token_types: list[list[int] | None] = []
        for prompt in prompts:
            first, second = prompt["pair"]
            encoded = model.tokenizer(first, second, truncation=True, max_length=model.max_model_len)
            self.inputs.append(list(encoded["input_ids"]))
            self.token_types.append(list(encoded["token_type_ids"]) if "token_type_ids" in encoded else None)
        self.results = [None] * len(self.inputs)

    def row(self, index: int) -> dict[str, list[int]]:
        types = self.token_types[index]
        return {"input_ids": self.inputs[index], **({"token_type_ids": types} if types is not None else {})}

    def deliver(self, index: int, logits: torch.Tensor) -> None:
        value = torch.sigmoid(logits[0]) if self.sigmoid else logits[0]
        self.results[index] = score_delta(index, float(value))


class EmbeddingScoreJob(EmbeddingJob):
    """The pairs' distinct texts embedded as one /v1/embeddings job would; each pair scored by cosine."""

    truncate = True  # as SentenceTransformer.encode does; /v1/embeddings refuses a text that is too long

    def __init__(self, job: SubmitMessage, model: LoadedModel) -> None:
        pairs = [prompt["pair"] for prompt in job["prompts"]]
        texts = list(dict.fromkeys(text for pair in pairs for text in pair))
        super().__init__({**job, "prompts": [{"embed": text} for text in texts]}, model)
        position = {text: index for index, text in enumerate(texts)}
        self.pairs = [(position[first], position[second]) for first, second in pairs]
        self.vectors: list[torch.Tensor | None] = [None] * len(self.inputs)

    @property
    def finished(self) -> bool:
        return all(vector is not None for vector in self.vectors)

    def deliver(self, index: int, vector: torch.Tensor) -> None:
        self.vectors[index] = vector.float()

    def take_deltas(self) -> list[ChoiceDelta]:
        if not self.finished or self.delivered:
            return []
        self.delivered = True
        return [score_delta(index, float(F.cosine_similarity(self.vectors[first], self.vectors[second], dim=0)))
                for index, (first, second) in enumerate(self.pairs)]
