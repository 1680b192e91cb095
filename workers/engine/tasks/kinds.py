"""The job kinds beside generation, each behind one small interface the engine loop drives.

A generation job's choices join the token batch (workers/engine/core/scheduler.py); every other kind is a
`TaskKind`: which prompts it takes, how a job is made (input processing, refusals as JobError), and how
one engine step advances all of its jobs at once (between the batch's decode steps). Every job, of any
kind, answers the same few questions the loop asks: `request_id`, `reply_channel`, `started_message()`,
`take_deltas()`, `finished`, `usage()`, `streamed`, `answered` (and `sequences`: none for a task).
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from protocol import SubmitMessage
from workers.engine.models.model_loader import LoadedModel
from workers.engine.tasks.embedding import EmbeddingJob, advance_embeddings, is_embedding_prompt
from workers.engine.tasks.pair_scoring import is_pair_prompt, pair_job
from workers.engine.tasks.transcription import Transcription, is_audio_prompt


@dataclass(frozen=True)
class TaskKind:
    name: str
    takes: Callable[[object], bool]  # whether a job's first prompt is of this kind
    make: Callable[[SubmitMessage, LoadedModel], object]
    advance: Callable[[list, int], None]  # one step for all of this kind's jobs (the embedding batch size)
    together: bool  # True: one failure fails every job of the step's call; False: `advance` gets one job at a time


def _advance_transcriptions(jobs: list, _batch: int) -> None:
    for job in jobs:
        job.advance()  # one audio window per step


KINDS = (
    TaskKind("transcription", is_audio_prompt, Transcription, _advance_transcriptions, together=False),
    TaskKind("embedding", is_embedding_prompt, EmbeddingJob, advance_embeddings, together=True),
    TaskKind("pair score", is_pair_prompt, pair_job, advance_embeddings, together=True),
)


def task_kind(prompt) -> TaskKind | None:
    """The kind of job a prompt starts (None: generation)."""
    return next((kind for kind in KINDS if kind.takes(prompt)), None)
