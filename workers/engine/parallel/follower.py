"""A follower rank: its shard of the model, and rank 0's runner ops done again over its shard of the cache.

The follower keeps a `Shadow` of each sequence rank 0 told it of (what the runner reads of one: its prompt,
how far it prefilled, its cache while out of the batch, its last token) and a `FollowerRunner`, the same
ModelRunner as rank 0's, so every cache operation (prefix cache, chunks, padded prefills, the batch's
joins and pauses) is the same code on both sides. It never samples: rank 0 sends the token each row took.
"""
from __future__ import annotations

import faulthandler
import logging
import os
import pickle
import signal
import sys
import time
from types import SimpleNamespace

import torch

from workers.engine.execution.runner import ModelRunner, RunnerSettings
from workers.engine.plan import PrefillWork

logger = logging.getLogger(__name__)

NO_ADAPTER = SimpleNamespace(model=SimpleNamespace(adapter=None), model_name="")


class Tail:
    """A sequence's completion as the runner reads it: its length and its last token."""

    __slots__ = ("length", "last")

    def __init__(self, length: int = 0, last: int = 0) -> None:
        self.length, self.last = length, last

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index):
        if index == -1:
            return self.last
        if isinstance(index, slice) and index.start == -1 and index.stop is None:
            return [self.last] if self.length else []
        raise IndexError("a follower keeps only a completion's last token")


class _NoOutput:
    def copy_prompt_scores(self, other) -> None:  # prompt logprobs are rank 0's
        pass


class Shadow:
    """A follower's copy of one of rank 0's sequences: what ModelRunner reads and writes of it."""

    __slots__ = ("prompt_ids", "wants_prompt_logprobs", "max_tokens", "state", "prefilled", "cached_prompt_tokens",
                 "checkpoint_at", "recomputes", "completion_ids", "finished", "media_inputs", "request", "output")

    def __init__(self, prompt_ids: list[int], wants_prompt_logprobs: bool, max_tokens: int) -> None:
        self.prompt_ids = prompt_ids
        self.wants_prompt_logprobs = wants_prompt_logprobs
        self.max_tokens = max_tokens
        self.state = None
        self.prefilled = 0
        self.cached_prompt_tokens = 0
        self.checkpoint_at = 0
        self.recomputes = False  # rank 0 preempts no row of a split model (ModelRunner.preemptible)
        self.completion_ids = Tail()
        self.finished = False
        self.media_inputs = None
        self.request = NO_ADAPTER
        self.output = _NoOutput()

    @property
    def prefill_ids(self) -> list[int]:
        return self.prompt_ids

    def record_prompt_chunk(self, chunk_logits, last: bool) -> None:  # scored on rank 0
        pass


class FollowerRunner(ModelRunner):
    """ModelRunner over shadows: decode steps feed the tokens rank 0 sampled, and nothing is sampled here."""

    remembers_answers = False  # a shadow holds only its last token: the prefix caches stay alike on every rank
    keeps_rows_apart = False  # as rank 0's MirroredRunner

    def view(self):
        return self.rows

    def _last_tokens(self, rows):
        return [seq.completion_ids[-1] for seq in self.batch_rows]


class Follower:
    """Runs rank 0's ops in order until told to stop, or until rank 0 is gone."""

    def __init__(self, loaded, conn) -> None:
        self.loaded = loaded
        self.conn = conn
        self.runner: FollowerRunner | None = None
        self.shadows: dict[int, Shadow] = {}
        self.arrived = self.handled = 0.0

    def run(self) -> None:
        messages, handling = 0, 0.0  # time from a message's arrival to its forward: what the ops cost this rank
        with torch.inference_mode():
            while True:
                try:
                    data = self.conn.recv_bytes()
                except (EOFError, OSError):
                    logger.info("rank 0 is gone; stopping")
                    return
                self.arrived = time.perf_counter()
                for op in pickle.loads(data):
                    if op[0] == "stop":
                        logger.info("stopping after %d messages, %.0f us each from arrival to forward", messages,
                                    1e6 * handling / max(1, messages))
                        return
                    getattr(self, f"op_{op[0]}")(*op[1:])
                if self.handled >= self.arrived:  # a message with a forward (not the runner's construction)
                    messages += 1
                    handling += self.handled - self.arrived

    def _rows(self, ids) -> list[Shadow]:
        return [self.shadows[i] for i in ids]

    def op_runner(self, settings: RunnerSettings) -> None:
        self.runner = FollowerRunner(self.loaded, settings)

    def op_new(self, tid: int, prompt_ids: list[int], wants_prompt_logprobs: bool, max_tokens: int) -> None:
        self.shadows[tid] = Shadow(prompt_ids, wants_prompt_logprobs, max_tokens)

    def op_forget(self, tids: list[int]) -> None:
        for tid in tids:
            self.shadows.pop(tid, None)

    def op_attach(self, tid: int) -> None:
        self.runner.attach_prefix(self.shadows[tid])

    def op_remember(self, tid: int) -> None:
        self.runner.remember_prefix(self.shadows[tid])

    def op_prefill(self, tids: list[int], tokens: int, together: bool) -> None:
        work = PrefillWork(tuple(self._rows(tids)), tokens, together)
        self.handled = time.perf_counter()
        self.runner.execute_prefill(work)

    def op_share(self, source: int, sibling: int) -> None:
        self.runner.share_prefill(self.shadows[source], self.shadows[sibling])

    def op_join(self, rows: list[tuple[int, int, int]]) -> None:
        joining = []
        for tid, length, last in rows:
            seq = self.shadows[tid]
            seq.completion_ids = Tail(length, last)
            joining.append(seq)
        self.runner.join(joining)

    def op_pause(self, tids: list[int]) -> None:
        self.runner.pause(self._rows(tids))

    def op_abandon(self) -> None:
        self.runner.abandon()

    def op_finished(self, tids: list[int]) -> None:
        for seq in self._rows(tids):
            seq.finished = True
        self.runner.drop_finished()

    def op_decode(self, lengths: list[int], lasts: list[int]) -> None:
        rows = self.runner.rows
        if len(rows) != len(lengths):
            raise RuntimeError(f"rank 0 decodes {len(lengths)} rows, this rank holds {len(rows)}")
        for seq, length, last in zip(rows, lengths, lasts):
            tail = seq.completion_ids
            tail.length, tail.last = length, last
        self.handled = time.perf_counter()
        self.runner.decode(None)


def follower_main(rank: int, load, conn) -> None:
    """A follower process: join the group, load the shard, say so, then follow rank 0's ops."""
    from protocol import ModelRef
    from workers.engine.models.model_loader import load_model, model_bytes
    from workers.engine.parallel.ranks import init_rank

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole process group: rank 0 stops this one
    # rank 0 sees only an exit code (-6: an abort, as a collective library's uncaught error is): the stacks go to
    # the server's log (the fork server's stderr is the worker's)
    faulthandler.enable(file=sys.stderr, all_threads=True)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format=f"%(asctime)s tp-rank-{rank} %(levelname)s %(name)s: %(message)s")
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(load.size))
    device = "cpu"
    if load.device_type == "cuda":
        torch.cuda.set_device(rank)
        device = f"cuda:{rank}"
    else:
        torch.set_num_threads(load.threads)
    torch.set_grad_enabled(False)
    try:
        init_rank(load, rank)
        loaded = load_model(ModelRef.parse(load.ref), device, load.dtype, None, load.options)
    except Exception as exc:
        logger.exception("loading the shard failed")
        conn.send(("error", str(exc)))
        return
    conn.send(("loaded", model_bytes(loaded.model)))
    try:
        Follower(loaded, conn).run()
    except Exception:
        logger.exception("an op failed; this rank stops (rank 0 restarts the group)")
        logging.shutdown()  # the line written before the process goes without its exit handlers
        os._exit(1)
