"""Embeddings: a sentence-transformers repo's pooled (and normalised) vectors, computed beside generation.

A model is an embedding model when its repo holds a sentence-transformers `modules.json`
(`protocol.modalities.model_kind`). Its modules say what happens after the transformer: a `Pooling`
module (`1_Pooling/config.json`: cls, mean, max, mean_sqrt_len_tokens or lasttoken, concatenated
when several are on) and an optional `Normalize`; `sentence_bert_config.json` gives `max_seq_length`
and `do_lower_case`. Encoders (BERT-style) and causal LMs (last-token pooling, loaded as their base
model) alike; other modules (Dense, …) are refused at load, never silently skipped.

An `EmbeddingJob` is a task kind (workers/engine/tasks/kinds.py), as a transcription is: no sequences;
each engine step `advance_embeddings` runs one batched forward over up to
`embedding_batch` pending inputs of every embedding job of a model, between the decode steps of
the running text batch. Each input's vector goes out as the `embedding` of its ChoiceDelta.
Pair scores (workers.engine.tasks.pair_scoring) are `PooledJob`s too: batched here beside embeddings.
"""
from __future__ import annotations

import time

import torch
import torch.nn.functional as F

import protocol
from protocol import ChoiceDelta, EmbeddingPrompt, Started, SubmitMessage, Usage
from workers.engine.errors import JobError
from workers.engine.models.model_loader import LoadedModel
from workers.engine.models.pooling import Pooling, pool

LENGTH_WINDOW = 8  # batches' worth of newer jobs' inputs a forward sorts beside all of the oldest job's
OVERTAKEN_AT_MOST = 8  # forwards that may take newer jobs' rows while the oldest's wait; then it goes alone


def is_embedding_prompt(prompt) -> bool:
    return isinstance(prompt, dict) and "embed" in prompt


class PooledJob:
    """A job of one forward per input and one answer at the end (embeddings, pair scores): its inputs are
    token-id rows, advanced a batch at a time by `advance_embeddings`, each row's output handed to `deliver`."""

    def __init__(self, job: SubmitMessage, model: LoadedModel) -> None:
        self.request_id: str = job["request_id"]
        self.reply_channel: str = job["reply_channel"]
        self.model = model
        self.arrived = time.monotonic()
        self.sequences: list = []  # nothing for the token batch: advance_embeddings runs it
        self.streamed, self.answered = False, False  # one answer, at the end
        self.inputs: list[list[int]] = []
        self.results: list[ChoiceDelta | None] = []  # one per input (an embedding) or per pair (a score)
        self._left: list[int] | None = None  # inputs not handed to a forward yet (all, until the first)
        self.overtaken = 0  # forwards that took a newer job's rows while this one's waited beside them
        self.delivered = False

    def row(self, index: int) -> dict[str, list[int]]:
        """What the forward takes for input `index` (its token ids; a text pair adds its token types)."""
        return {"input_ids": self.inputs[index]}

    @property
    def finished(self) -> bool:
        return all(result is not None for result in self.results)

    @property
    def left(self) -> list[int]:
        """The inputs not handed to a forward yet, by index."""
        if self._left is None:
            self._left = list(range(len(self.inputs)))
        return self._left

    def deliver(self, index: int, output: torch.Tensor) -> None:
        raise NotImplementedError

    def take_deltas(self) -> list[ChoiceDelta]:
        """Every input's result, once, when the last is computed (the answer is one body)."""
        if not self.finished or self.delivered:
            return []
        self.delivered = True
        return list(self.results)

    def started_message(self) -> Started:
        return {"type": protocol.STARTED, "model": self.model.model_id,
                "prompt_tokens": [len(ids) for ids in self.inputs], "prompt_token_ids": [[] for _ in self.inputs],
                "max_model_len": self.model.max_model_len}

    def usage(self) -> Usage:
        return {"prompt_tokens": sum(len(ids) for ids in self.inputs), "completion_tokens": 0}


class EmbeddingJob(PooledJob):
    """One /v1/embeddings request: its inputs tokenized at admission, pooled a batch at a time."""

    truncate = False  # a text longer than the model's length: refused (OpenAI's), or cut to it (a pair score's)

    def __init__(self, job: SubmitMessage, model: LoadedModel) -> None:
        super().__init__(job, model)
        pooling: Pooling | None = model.pooling
        if model.kind != "embedding" or pooling is None:
            raise JobError(400, f"The model `{model.model_id}` does not produce embeddings (its repo holds no "
                           "sentence-transformers modules.json with a pooling config).", "model", "unsupported_model")
        self.pooling = pooling
        prompts: list[EmbeddingPrompt] = job["prompts"]
        self.dimensions = prompts[0].get("dimensions") if prompts else None
        if self.dimensions is not None and not pooling.allows(self.dimensions):
            allowed = (f"one of {', '.join(map(str, pooling.matryoshka))} or {pooling.dimension}"
                       if isinstance(pooling.matryoshka, tuple) else
                       f"1 to {pooling.dimension}" if pooling.matryoshka else f"only {pooling.dimension}")
            raise JobError(400, f"The model `{model.model_id}` does not take dimensions={self.dimensions} "
                           f"({allowed}).", "dimensions", "invalid_value")
        self.inputs = [self._tokenize(prompt["embed"], index) for index, prompt in enumerate(prompts)]
        self.results: list[ChoiceDelta | None] = [None] * len(self.inputs)

    def _tokenize(self, embed: str | list[int], index: int) -> list[int]:
        tokenizer = self.model.tokenizer
        if isinstance(embed, str):
            text = embed.lower() if self.pooling.do_lower_case else embed
            ids = tokenizer(text, add_special_tokens=True, truncation=self.truncate,
                            max_length=self.model.max_model_len if self.truncate else None)["input_ids"]
        else:
            vocab = len(tokenizer)
            if any(not 0 <= t < vocab for t in embed):
                raise JobError(400, f"input[{index}] holds token ids outside the vocabulary (0 to {vocab - 1}).",
                               "input", "invalid_value")
            ids = list(embed)
        limit = self.model.max_model_len
        if len(ids) > limit:
            raise JobError(400, f"This model's maximum context length is {limit} tokens; input[{index}] has "
                           f"{len(ids)} tokens.", "input", "context_length_exceeded")
        if not ids:
            raise JobError(400, f"input[{index}] is empty.", "input", "invalid_value")
        return ids

    def deliver(self, index: int, vector: torch.Tensor) -> None:
        if self.dimensions is not None and self.dimensions < vector.shape[0]:
            vector = F.normalize(vector[: self.dimensions], dim=0)
        self.results[index] = {"index": index, "text": "", "token_ids": [], "logprobs": None,
                               "finish_reason": "stop", "embedding": vector.float().cpu().tolist()}


def advance_embeddings(jobs: list[PooledJob], batch: int) -> None:
    """One batched forward per model over up to `batch` inputs still pending: pooled vectors of an embedding
    model, logits of a cross-encoder (workers.engine.tasks.pair_scoring).

    The rows are the longest among every pending input of the oldest job and the oldest LENGTH_WINDOW
    batches' worth of the others' (oldest jobs first), so a forward's rows are of similar lengths and pad
    little, as sentence-transformers' `encode` sorts all of a call's inputs (a job answers only once all its
    inputs are done: their order within it costs it nothing). Short inputs could wait behind a stream of
    newer long ones: once the oldest job has been overtaken OVERTAKEN_AT_MOST times, its rows go alone."""
    by_model: dict[int, list[PooledJob]] = {}
    for job in jobs:
        if job.left:
            by_model.setdefault(id(job.model), []).append(job)
    for model_jobs in by_model.values():
        oldest, *newer = sorted(model_jobs, key=lambda j: j.arrived)
        window: list[tuple[PooledJob, int]] = [(oldest, index) for index in oldest.left]
        waiting = [oldest]
        for job in newer if oldest.overtaken < OVERTAKEN_AT_MOST else ():
            if len(window) >= LENGTH_WINDOW * batch:
                break
            window += [(job, index) for index in job.left[: LENGTH_WINDOW * batch - len(window)]]
            waiting.append(job)
        window.sort(key=lambda row: -len(row[0].inputs[row[1]]))  # stable: equal lengths keep their age
        rows = window[:batch]
        newest_taken = max(waiting.index(job) for job, _ in rows)
        for job in waiting[:newest_taken]:
            job.overtaken += 1
        for job, index in rows:
            job.left.remove(index)
        loaded = model_jobs[0].model
        inputs = padded(loaded, [job.row(index) for job, index in rows])
        outputs = classify_rows(loaded, inputs) if loaded.kind == "cross_encoder" else embed_rows(loaded, inputs)
        for (job, index), output in zip(rows, outputs):
            job.deliver(index, output)


def padded(loaded: LoadedModel, rows: list[dict[str, list[int]]]) -> dict[str, torch.Tensor]:
    """Rows right-padded into one batch with an attention mask (and token types where the rows carry them)."""
    width = max(len(row["input_ids"]) for row in rows)
    pad = loaded.tokenizer.pad_token_id if loaded.tokenizer.pad_token_id is not None else 0
    batch = {"input_ids": torch.full((len(rows), width), pad, dtype=torch.long),
             "attention_mask": torch.zeros((len(rows), width), dtype=torch.long)}
    if "token_type_ids" in rows[0]:
        batch["token_type_ids"] = torch.zeros((len(rows), width), dtype=torch.long)
    for index, row in enumerate(rows):
        length = len(row["input_ids"])
        batch["attention_mask"][index, :length] = 1
        for key, values in row.items():
            batch[key][index, :length] = torch.tensor(values)
    return {key: value.to(loaded.device) for key, value in batch.items()}


def classify_rows(loaded: LoadedModel, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
    """A cross-encoder's logits, one row of `num_labels` per text pair."""
    output = loaded.model(**inputs)
    return (output[0] if isinstance(output, tuple) else output.logits).float()


def embed_rows(loaded: LoadedModel, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
    """Pooled (and normalised) vectors of the batch's rows, one forward."""
    pooling: Pooling = loaded.pooling
    mask = inputs["attention_mask"]
    output = loaded.model(**inputs)
    hidden = output[0] if isinstance(output, tuple) else output.last_hidden_state
    vectors = pool(hidden, mask, pooling.modes)
    if pooling.normalize:
        vectors = F.normalize(vectors, p=2, dim=1)
    return vectors
