"""Rank 0's runner: every op that touches the cache goes to the followers first, then runs here.

Ops without a forward (a prefix lookup, a join, a pause) wait in a list and go with the next forward's
message, so a decode step is one message: each row's completion length and last token. Sequences get a
small id the first time an op names them; when one is collected here its shadow is forgotten there.
Any failure breaks the group (a rank may be stuck in a collective): the engine reloads the model.
"""
from __future__ import annotations

import itertools
import logging
import time
import weakref
from dataclasses import replace

from workers.engine.execution.runner import ModelRunner, RunnerSettings
from workers.engine.models.model_loader import LoadedModel
from workers.engine.parallel.group import TensorParallelGroup
from workers.engine.plan import DecodePlan, PrefillOutput, PrefillWork, StepOutput
from workers.engine.sequences import Sequence

logger = logging.getLogger(__name__)


class GroupDown(RuntimeError):
    """The model's tensor-parallel group cannot run a step (a rank died or a collective failed); its requests
    hear a 503 (the model is being loaded again: a retry may succeed)."""

    status, code = 503, "model_restarting"


class MirroredRunner(ModelRunner):
    """A ModelRunner whose cache operations are mirrored on the model's follower ranks."""

    remembers_answers = False  # the followers' shadows hold only their last tokens (follower.py)
    keeps_rows_apart = False  # every rank's rows in the same places, whatever their lengths

    def __init__(self, loaded: LoadedModel, settings: RunnerSettings) -> None:
        self.group: TensorParallelGroup = loaded.parallel
        self.broken: str | None = None
        self._pending: list[tuple] = []
        self._ids: dict[int, int] = {}  # id(seq) -> the id its shadow has on the followers
        self._next_id = itertools.count()
        self._forgotten: list[int] = []
        self._sent = (0, 0.0)  # messages and their sending time, for /metrics
        # CUDA graphs capture no collectives here, and a draft's acceptance would need every rank's agreement
        declined = [what for what, on in (("the static decode step", settings.static_decode),
                                          ("speculative decoding", settings.speculative is not None)) if on]
        if declined:
            logger.warning("%s: tensor parallel runs without %s", loaded.model_id, " and ".join(declined))
        settings = replace(settings, static_decode=False, cuda_graphs=False, speculative=None)
        self._send_now([("runner", settings)])  # the followers build theirs, with the same forwards at load
        super().__init__(loaded, settings)

    # --- the op stream -------------------------------------------------------
    def _send_now(self, ops: list[tuple]) -> None:
        if self.broken is not None:
            raise GroupDown(f"the model's tensor-parallel group is down ({self.broken}); it is being reloaded")
        if self._forgotten:  # last: an op waiting in _pending may name a sequence collected since
            forgotten, self._forgotten = self._forgotten, []
            ops = [*ops, ("forget", forgotten)]
        started = time.perf_counter()
        try:
            self.group.send([*self._pending, *ops])
            self._sent = (self._sent[0] + 1, self._sent[1] + time.perf_counter() - started)
        except Exception as exc:
            self._break(f"the followers could not be reached: {exc}")
            raise GroupDown(self.broken) from exc
        self._pending = []

    def _tid(self, seq: Sequence) -> int:
        """The shadow id of `seq`, announced to the followers the first time."""
        tid = self._ids.get(id(seq))
        if tid is None:
            tid = next(self._next_id)
            self._ids[id(seq)] = tid
            weakref.finalize(seq, self._collected, id(seq), tid)
            self._pending.append(("new", tid, seq.prompt_ids, seq.wants_prompt_logprobs, seq.max_tokens))
        return tid

    def _collected(self, key: int, tid: int) -> None:
        if self._ids.get(key) == tid:
            self._ids.pop(key, None)
        self._forgotten.append(tid)

    def _break(self, why: str) -> None:
        if self.broken is None:
            self.broken = why
            logger.error("%s: tensor-parallel group down: %s", self.loaded.model_id, why)

    def _forward_op(self, op: tuple, run):
        """Send an op with a forward, then run it here; a failure on either side breaks the group."""
        self._send_now([op])
        try:
            return run()
        except Exception as exc:
            self._break(self.group.problem(wait=1.0) or f"{type(exc).__name__}: {exc}"[:300])
            raise GroupDown(f"the model's tensor-parallel group is down ({self.broken}); it is being reloaded") from exc

    def take_sent(self) -> tuple[int, float]:
        sent, self._sent = self._sent, (0, 0.0)
        return sent

    def problem(self) -> str | None:
        """Why this model cannot serve now (its group is down), or None."""
        if self.broken is None:
            problem = self.group.problem()
            if problem is not None:
                self._break(problem)
        return self.broken

    # --- ModelRunner's ops, mirrored -----------------------------------------
    def attach_prefix(self, seq: Sequence) -> int | None:
        cached = super().attach_prefix(seq)
        if cached is not None:
            self._pending.append(("attach", self._tid(seq)))
        return cached

    def remember_prefix(self, seq: Sequence) -> None:
        super().remember_prefix(seq)
        self._pending.append(("remember", self._tid(seq)))

    def execute_prefill(self, work: PrefillWork) -> PrefillOutput:
        op = ("prefill", [self._tid(seq) for seq in work.rows], work.tokens, work.together)
        return self._forward_op(op, lambda: super(MirroredRunner, self).execute_prefill(work))

    def share_prefill(self, source: Sequence, sibling: Sequence) -> None:
        super().share_prefill(source, sibling)
        self._pending.append(("share", self._tid(source), self._tid(sibling)))

    def join(self, sequences: list[Sequence]) -> None:
        if sequences:
            self._pending.append(("join", [(self._tid(seq), len(seq.completion_ids), seq.completion_ids[-1])
                                           for seq in sequences]))
        super().join(sequences)

    def pause(self, sequences: list[Sequence]) -> None:
        self._pending.append(("pause", [self._tid(seq) for seq in sequences]))
        super().pause(sequences)

    def abandon(self) -> list[Sequence]:
        self._pending.append(("abandon",))
        return super().abandon()

    def drop_finished(self) -> None:
        finished = [self._tid(seq) for seq in self.rows if seq.finished]
        if finished:
            self._pending.append(("finished", finished))
        super().drop_finished()

    def execute(self, plan: DecodePlan) -> StepOutput:
        rows = self.rows
        op = ("decode", [len(seq.completion_ids) for seq in rows], [seq.completion_ids[-1] for seq in rows])
        return self._forward_op(op, lambda: super(MirroredRunner, self).execute(plan))
