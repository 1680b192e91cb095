"""Each HTTP request's thread for Django's synchronous work, lent from a pool instead of started anew.

Django runs a request's synchronous parts (its `request_started` and `request_finished` receivers, a
sync view or middleware, `response.close`) on one thread owned by that request (asgiref's
`ThreadSensitiveContext`). Stock Django starts that thread for every request, and at the end starts
another thread to join it: two thread starts per request, about 2 of the 14 ms a small completion
took end to end on 2 cores, and more loop turns for every request beside a flood. Here a request
borrows an idle single-thread executor for its whole life and gives it back at the end, so a thread
still serves one request at a time, as Django expects, and its database connection is closed at the
request's end by Django's `request_finished` as before (so `request_started`'s check, a hand-off of its
own, is left out: `drop_request_started_database_check`).
"""
from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

from asgiref.sync import ThreadSensitiveContext
from django.conf import settings
from django.core import signals
from django.core.handlers.asgi import ASGIHandler
from django.db import close_old_connections, reset_queries


class RequestThreads:
    """Idle single-thread executors, at most `keep_idle` of them kept for the next requests.

    As many as a busy server has requests at once: with 32 kept, 64 streams at once started 32 threads on the
    event loop every time they came (8 % of its samples while streaming); an idle thread holds little memory."""

    def __init__(self, keep_idle: int = 256) -> None:
        self.keep_idle = keep_idle
        self.started = 0  # executors made so far (each runs one thread)
        self._idle: list[ThreadPoolExecutor] = []
        self._lock = threading.Lock()

    def borrow(self) -> ThreadPoolExecutor:
        with self._lock:
            if self._idle:
                return self._idle.pop()
            self.started += 1
        return ThreadPoolExecutor(max_workers=1, thread_name_prefix="request")

    def give_back(self, executor: ThreadPoolExecutor) -> None:
        """Lend `executor` again once the calls it still holds have returned.

        A request cancelled by its client's leaving can leave a sync call running on its thread; the
        next borrower must not queue behind it.
        """
        executor.submit(_nothing).add_done_callback(lambda _: self._keep(executor))

    def idle(self) -> int:
        with self._lock:
            return len(self._idle)

    def _keep(self, executor: ThreadPoolExecutor) -> None:
        with self._lock:
            if len(self._idle) < self.keep_idle:
                self._idle.append(executor)
                return
        executor.shutdown(wait=False)  # its thread ends once this call returns; nobody waits for it


def _nothing() -> None:
    pass


class PooledThreadsASGIHandler(ASGIHandler):
    """Django's ASGI handler, with each request's thread-sensitive work on a thread lent by `threads`."""

    def __init__(self, threads: RequestThreads) -> None:
        super().__init__()
        self.threads = threads

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            raise ValueError(f"Django can only handle ASGI/HTTP connections, not {scope['type']}.")
        executor = self.threads.borrow()
        try:
            # A context given an executor leaves it running at the exit; the handler has awaited every
            # task of the request by then.
            async with ThreadSensitiveContext(executor=executor):
                await self.handle(scope, receive, send)
        finally:
            self.threads.give_back(executor)


def drop_request_started_database_check() -> bool:
    """Leave out Django's `request_started` receivers where they have nothing to do; whether it did.

    They close a thread's database connections that outlived `CONN_MAX_AGE` (and clear DEBUG's query
    log). With `CONN_MAX_AGE` 0 everywhere (ours) `request_finished` closes every connection a request
    opened on its thread at its end, so a lent thread starts each request without one; and with only
    synchronous receivers Django's async handler sends the signal on the request's thread: a thread
    woken and the loop woken back, one of the four hand-offs a small request made.
    """
    if settings.DEBUG or any(db.get("CONN_MAX_AGE", 0) != 0 for db in settings.DATABASES.values()):
        return False
    signals.request_started.disconnect(close_old_connections)
    signals.request_started.disconnect(reset_queries)
    return True
