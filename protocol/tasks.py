"""Background tasks with an owner: when one ends unexpectedly, it is logged and someone acts.

`asyncio.create_task` alone lets a task die unseen (its exception surfaces, at best, when it is
garbage-collected). `watch` names the task, logs how it ended unless it was cancelled, and calls
`on_end(reason)`, so the owner can stop taking work, restart it, or stop the process.
"""
from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine

logger = logging.getLogger(__name__)


def watch(work: Coroutine, name: str, on_end: Callable[[str], None] | None = None) -> asyncio.Task:
    """Start `work` as a task whose end is logged and handed to `on_end` (not on cancellation).

    A task with no `on_end` is one-off work (a media read): only a failure is logged.
    """
    task = asyncio.ensure_future(work)

    def ended(task: asyncio.Task) -> None:
        if task.cancelled():
            return
        error = task.exception()
        if on_end is None:
            if error is not None:
                logger.error("%s failed", name, exc_info=error)
            return
        reason = f"{name} failed: {error!r}" if error is not None else f"{name} ended"
        logger.critical("%s", reason, exc_info=error)
        on_end(reason)

    task.add_done_callback(ended)
    return task
