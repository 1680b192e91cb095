"""A request's synchronous Django work runs on one thread of its own, lent from a pool and reused.

Django's real ASGI handler and its real `request_started`/`request_finished` signals, driven through
asgiref's ApplicationCommunicator: the receivers below note which thread Django ran them on.
"""
from __future__ import annotations

import asyncio
import threading
import time

import pytest
from asgiref.testing import ApplicationCommunicator
from django.core.signals import request_finished, request_started

from inference_site.request_threads import PooledThreadsASGIHandler, RequestThreads


def http_scope(path: str) -> dict:
    return {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "GET", "scheme": "http",
            "path": path, "raw_path": path.encode(), "query_string": b"", "root_path": "",
            "headers": [(b"host", b"localhost")], "client": ("127.0.0.1", 40000), "server": ("localhost", 80)}


async def get(app, path: str) -> int:
    communicator = ApplicationCommunicator(app, http_scope(path))
    await communicator.send_input({"type": "http.request", "body": b""})
    start = await communicator.receive_output(10)
    while (await communicator.receive_output(10)).get("more_body"):
        pass
    await communicator.wait(10)
    return start["status"]


async def given_back(threads: RequestThreads, idle: int) -> None:
    """Until `idle` executors wait to be lent (one is lent again once its thread has finished its calls)."""
    deadline = time.monotonic() + 10
    while threads.idle() < idle:
        assert time.monotonic() < deadline, "a request's thread was never given back"
        await asyncio.sleep(0.001)


@pytest.fixture
def noted_threads():
    """path -> the thread `request_started` ran on; and the threads `request_finished` ran on, in order."""
    started: dict[str, int] = {}
    finished: list[int] = []
    meeting = {}

    def on_started(sender, scope=None, **kwargs):
        started[scope["path"]] = threading.get_ident()
        barrier = meeting.get("barrier")
        if barrier is not None:  # two requests at once: each must be on its own thread to meet the other
            try:
                barrier.wait()
                meeting.setdefault("met", []).append(scope["path"])
            except threading.BrokenBarrierError:
                pass

    def on_finished(sender, **kwargs):
        finished.append(threading.get_ident())

    request_started.connect(on_started)
    request_finished.connect(on_finished)
    yield started, finished, meeting
    request_started.disconnect(on_started)
    request_finished.disconnect(on_finished)


def test_sequential_requests_reuse_one_lent_thread_for_all_their_sync_work(noted_threads):
    started, finished, _ = noted_threads
    threads = RequestThreads()
    app = PooledThreadsASGIHandler(threads)

    async def five():
        statuses = []
        for i in range(5):
            statuses.append(await get(app, f"/no-such-page-{i}"))
            await given_back(threads, 1)
        return statuses

    assert asyncio.run(five()) == [404] * 5
    assert len(started) == 5 and len(finished) == 5
    # Each request's start and finish ran on one thread, not the event loop's; the five shared it in turn.
    assert [started[f"/no-such-page-{i}"] for i in range(5)] == finished
    assert len(set(finished)) == 1 and threading.get_ident() not in finished
    assert threads.started == 1


def test_requests_at_once_each_get_a_thread_and_the_spare_ones_are_let_go(noted_threads):
    started, finished, meeting = noted_threads
    meeting["barrier"] = threading.Barrier(2, timeout=10)
    threads = RequestThreads(keep_idle=1)
    app = PooledThreadsASGIHandler(threads)

    async def two_at_once():
        return await asyncio.gather(get(app, "/a"), get(app, "/b"))

    assert asyncio.run(two_at_once()) == [404, 404]
    assert sorted(meeting["met"]) == ["/a", "/b"], "the two requests did not run on threads of their own"
    assert started["/a"] != started["/b"] and threads.started == 2
    # One thread is kept for the next request, the other was let go.
    meeting.pop("barrier")
    asyncio.run(given_back(threads, 1))
    asyncio.run(get(app, "/c"))
    assert started["/c"] in (started["/a"], started["/b"]) and threads.started == 2


def test_a_burst_of_a_busy_servers_size_finds_its_threads_kept_from_the_last():
    threads = RequestThreads()
    for _ in range(2):
        lent = [threads.borrow() for _ in range(200)]  # 200 requests at once, twice
        for executor in lent:
            threads.give_back(executor)
        asyncio.run(given_back(threads, 200))
    assert threads.started == 200


def test_a_thread_still_running_a_cancelled_requests_call_is_not_lent_until_it_returns():
    threads = RequestThreads()
    release = threading.Event()
    busy = threads.borrow()
    busy.submit(release.wait, 10)  # a sync call a cancelled request left running on its thread
    threads.give_back(busy)
    other = threads.borrow()
    assert other is not busy and threads.started == 2
    release.set()
    asyncio.run(given_back(threads, 1))
    assert threads.borrow() is busy
