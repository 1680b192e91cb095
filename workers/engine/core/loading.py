"""Model loads off the engine thread: one loader thread; jobs and load requests wait parked.

A load takes seconds to minutes (reading weights, or downloading them), and the engine thread
must keep decoding every other model's streams meanwhile. So the engine only decides a load
(room, settings: `ModelManager.begin_load`), this module runs it on its own thread, and the
engine installs the result when the loader wakes it (`ModelManager.finish_load`). Jobs for a
model that is loading wait for that same load: concurrent first requests load once.
"""
from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

import protocol
from protocol import ModelRef
from workers.engine.cpu_share import torch_on_one_thread
from workers.engine.models.model_loader import LoadedModel
from workers.engine.core.model_manager import LoadPlan, ModelManager

logger = logging.getLogger(__name__)

# The loader thread's nice value: it takes only what decoding leaves of the cores.
LOADER_NICE = 19
# The engine's own inbox message: a load finished (either way); handled on the engine thread.
LOAD_FINISHED = "engine.load_finished"
Listener = Callable[[protocol.ModelEvent], None]


@dataclass
class PendingLoad:
    plan: LoadPlan
    future: Future
    jobs: list[dict] = field(default_factory=list)  # generation jobs to admit once loaded
    listeners: list[Listener] = field(default_factory=list)  # model.load requests: progress, then ready/error

    def progress(self, stage: str, value: dict | None = None) -> None:
        """Called on the loader thread; each listener must be safe to call from any thread."""
        event: protocol.ModelEvent = {"status": "loading", "model": self.plan.name, "stage": stage}
        if value:
            event["progress"] = value
        for listener in list(self.listeners):
            listener(event)


class Loader:
    """Runs `LoadPlan`s one at a time on a thread of its own; `wake(message)` tells the engine one is done."""

    def __init__(self, manager: ModelManager, wake: Callable[[dict], None]) -> None:
        self.manager = manager
        self.wake = wake
        self.pending: dict[str, PendingLoad] = {}
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="model-loader",
                                            initializer=_yield_to_decoding)

    def start(self, ref: ModelRef, busy: set[str], requested_by: str, listener: Listener | None = None) -> PendingLoad:
        """The load of `ref` under way, started now if none is (engine thread; may raise ModelLoadError).

        A `listener` hears every stage from the first, then ready or error.
        """
        pending = self.pending.get(ref.key)
        if pending is None:
            plan = self.manager.begin_load(ref, busy, requested_by)
            pending = self.pending[ref.key] = PendingLoad(plan, Future())
            if listener is not None:
                pending.listeners.append(listener)
            self._executor.submit(self._run, pending)
        elif listener is not None:
            pending.listeners.append(listener)
        return pending

    def _run(self, pending: PendingLoad) -> None:
        try:
            pending.future.set_result(pending.plan.load(pending.progress))
        except BaseException as exc:  # handed to the engine thread, which answers every waiter
            pending.future.set_exception(exc)
        self.wake({"type": LOAD_FINISHED, "model": pending.plan.name})

    def finish(self, name: str) -> tuple[PendingLoad, LoadedModel | None, Exception | None]:
        """Install a finished load (engine thread): (its waiters, the model or None, the error or None)."""
        pending = self.pending.pop(name)
        try:
            loaded = self.manager.finish_load(pending.plan, pending.future.result())
        except Exception as exc:
            logger.info("loading %s failed: %s", name, exc)
            self.manager.fail_load(pending.plan, exc)
            return pending, None, exc
        return pending, loaded, None

    def stop(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)


def _yield_to_decoding() -> None:
    """Lower the loader thread's CPU priority (Linux: nice is per thread), and keep its torch work on
    itself (no OpenMP team of its own beside the engine's: workers/engine/cpu_share.py).

    A load is mostly torch work on all cores; at equal priority it took three quarters of the
    running streams' speed on 2 cores. Niced, it runs in what decoding leaves idle.
    """
    torch_on_one_thread()
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), LOADER_NICE)
    except (AttributeError, OSError):  # not Linux, or not allowed: loads just compete as before
        logger.debug("could not lower the loader thread's priority", exc_info=True)
