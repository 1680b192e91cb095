"""The engine's torch thread count follows the cores other processes leave free."""
from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest
import torch

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
