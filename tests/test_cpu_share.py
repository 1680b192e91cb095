"""The engine's torch thread count follows the cores other processes leave free."""
from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest
import torch

from workers.engine import cpu_share
from workers.engine.cpu_share import ThreadGovernor

BUSY_LOOP = "import os, sys; os.sched_setaffinity(0, {int(sys.argv[1])})\nwhile True: pass"


def test_a_fixed_count_is_kept():
    before = torch.get_num_threads()
    try:
        governor = ThreadGovernor(fixed_threads=1)
        governor.adjust()
        assert governor.threads == torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)


@pytest.mark.skipif(not hasattr(os, "sched_getaffinity") or len(os.sched_getaffinity(0)) < 2, reason="needs 2+ cores")
def test_busy_processes_on_every_core_leave_the_engine_one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(len(os.sched_getaffinity(0)))
    governor = ThreadGovernor()
    assert governor.threads >= 2
    competitors = [subprocess.Popen([sys.executable, "-c", BUSY_LOOP, str(core)]) for core in sorted(governor.cores)]
    try:
        deadline = time.monotonic() + 3.5  # three checks, a second apart
        while time.monotonic() < deadline:
            governor.adjust()
            time.sleep(0.1)
        assert governor.others_cores >= 0.5
        assert governor.threads == torch.get_num_threads() == 1
    finally:
        for process in competitors:
            process.kill()
            process.wait()
        torch.set_num_threads(before)


@pytest.mark.skipif(not hasattr(os, "sched_getaffinity") or len(os.sched_getaffinity(0)) < 2, reason="needs 2+ cores")
def test_a_busy_thread_beside_the_engine_costs_it_a_thread_when_named():
    """A thread of the engine's own process that keeps a core busy (the event loop streaming, the output thread)
    counts as another process does when the engine names it; unnamed, it counts as the engine's own. Two
    governors over the same seconds, one naming it: whatever else runs on the machine, both see it alike."""
    import hashlib
    import threading

    before = torch.get_num_threads()
    torch.set_num_threads(len(os.sched_getaffinity(0)))
    stop = threading.Event()
    data = bytes(1 << 20)

    def busy() -> None:  # hashing a large buffer lets go of the GIL: a core kept busy, the test's thread free
        while not stop.is_set():
            hashlib.sha256(data).digest()

    worker = threading.Thread(target=busy)
    worker.start()
    try:
        named, unnamed = ThreadGovernor(beside=lambda: [worker.native_id]), ThreadGovernor()
        deadline = time.monotonic() + 3.5  # three checks, a second apart
        while time.monotonic() < deadline:
            named.adjust()
            unnamed.adjust()
            time.sleep(0.1)
        assert named.others_cores - unnamed.others_cores >= 0.3  # the thread had a core, less what others took
        assert named.threads < named.most and named.threads <= unnamed.threads
    finally:
        stop.set()
        worker.join()
        torch.set_num_threads(before)


@pytest.mark.skipif(not hasattr(os, "sched_getaffinity") or len(os.sched_getaffinity(0)) < 2, reason="needs 2+ cores")
def test_what_ran_while_the_engine_was_idle_does_not_cost_it_threads():
    before = torch.get_num_threads()
    torch.set_num_threads(len(os.sched_getaffinity(0)))
    governor = ThreadGovernor()
    most = governor.threads
    governor.adjust()  # the window starts
    competitors = [subprocess.Popen([sys.executable, "-c", BUSY_LOOP, str(core)]) for core in sorted(governor.cores)]
    try:
        time.sleep(4)  # idle engine: no steps, no checks, while every core is busy
    finally:
        for process in competitors:
            process.kill()
            process.wait()
    try:
        governor.adjust()  # the first step after the idle spell, on a quiet machine again
        assert governor.threads == torch.get_num_threads() == most
    finally:
        torch.set_num_threads(before)


def test_only_the_engine_thread_runs_torch_on_several_threads():
    """The loader and beam-search threads keep their torch work on themselves: a second OpenMP team in
    the worker makes the engine's every operator wait on sleeping threads (workers/engine/cpu_share.py)."""
    from workers.engine.tasks.beam_search import BeamRunner
    from workers.engine.core.loading import Loader

    mine = torch.get_num_threads()
    loader, beams = Loader(manager=None, wake=lambda message: None), BeamRunner(on_done=lambda request_id: None)
    try:
        assert loader._executor.submit(torch.get_num_threads).result() == 1
        assert beams._pool.submit(torch.get_num_threads).result() == 1
    finally:
        loader.stop()
        beams.shutdown()
    assert torch.get_num_threads() == mine


CORES = min(len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 1, cpu_share.DEFAULT_THREADS)
many_cores = pytest.mark.skipif(CORES < 2, reason="needs torch to use 2+ cores by default")


def on_a_thread_of_its_own(function):
    """`function()` run on a new thread, to its end; what it returned."""
    import threading

    result = {}
    thread = threading.Thread(target=lambda: result.setdefault("value", function()))
    thread.start()
    thread.join(60)
    return result["value"]


@many_cores
def test_an_engine_thread_keeps_every_core_whatever_the_loader_set_before_and_after():
    """torch gives a thread, the first time it runs torch, the count some other thread set last (process-wide):
    the loader's `torch_on_one_thread` before the engine thread started, or between the governor's start and
    the engine's first operator, left the engine on one core of two (a 135M model at 0.64x `generate`)."""
    import threading

    from workers.engine.cpu_share import torch_on_one_thread

    before = torch.get_num_threads()
    started, loaded = threading.Event(), threading.Event()
    seen = {}

    def engine_thread() -> None:
        governor = ThreadGovernor()
        seen["governor"] = governor.threads
        started.set()
        loaded.wait(30)
        seen["torch"] = torch.get_num_threads()

    try:
        on_a_thread_of_its_own(torch_on_one_thread)  # a load before the engine thread starts
        engine = threading.Thread(target=engine_thread)
        engine.start()
        started.wait(30)
        on_a_thread_of_its_own(torch_on_one_thread)  # a load after the governor started, before any step
        loaded.set()
        engine.join(30)
        assert seen == {"governor": CORES, "torch": CORES}
    finally:
        torch.set_num_threads(before)


@many_cores
def test_the_warm_up_leaves_no_team_of_torch_threads_on_its_thread():
    """The worker warms up on a thread of a pool that stays (asyncio.to_thread): a team of OpenMP threads left
    there made the engine's operators sleep and wake at every barrier (two threads decoding no faster than one)."""
    from concurrent.futures import ThreadPoolExecutor

    from workers.engine.warmup import warm_up

    before = torch.get_num_threads()
    torch.set_num_threads(CORES)  # what a new thread takes as its own count unless it sets one
    try:
        with ThreadPoolExecutor(1) as pool:
            pool.submit(warm_up).result()
            assert pool.submit(torch.get_num_threads).result() == 1
    finally:
        torch.set_num_threads(before)
