"""How many torch threads the engine uses on a machine it does not have to itself.

torch's intra-op threads meet at a barrier after every parallel operator. When
another process takes one of the cores, the thread that lost its core holds up
all the others at every barrier, and the spinning waiters take CPU from our own
event loop too: on 2 cores beside one busy process, two threads decode several
times slower than one. So by default (`INFERENCE_TORCH_THREADS=0`) the engine
uses the cores other processes leave free, measured from /proc every second:
all of torch's threads on a quiet machine, fewer while something else runs.
The threads beside the engine in its own process that keep a core busy count
as others too: the event loop serving HTTP, the output thread detokenizing.
Streaming 64 tiny-model streams on 2 cores, they used half a core, and torch's
second thread, spinning at every barrier, only took it from them.
A positive setting fixes the count instead.

Only the engine thread runs torch on several threads (`torch_on_one_thread` for every other
thread of the worker that runs torch: the loader, beam search). OpenMP gives each thread that
starts a parallel operator a team of its own; once the process holds more OpenMP threads than
cores, every team's waiters stop spinning and sleep at each barrier. A loader thread left idle
after one load, with its team, made the engine's every operator pay those wake-ups: raw
`generate` in such a process ran at a third of its speed (tiny model, 2 cores).
"""
from __future__ import annotations

import logging
import math
import os
import time
from collections.abc import Callable, Iterable

import torch

logger = logging.getLogger(__name__)

CHECK_SECONDS = 1.0
# A window longer than this spans an idle spell of the engine (no steps, no checks): what other
# processes did then says nothing about now, so it only starts a fresh window.
STALE_WINDOW_SECONDS = 3 * CHECK_SECONDS
# Another process using at least this much of a core costs the engine a thread.
BUSY_CORE_THRESHOLD = 0.25


def torch_on_one_thread() -> None:
    """For a thread that is not the engine's: its torch operators run on it alone (see above)."""
    torch.set_num_threads(1)


def _cores() -> set[int]:
    try:
        return os.sched_getaffinity(0)
    except AttributeError:  # not Linux
        return set(range(os.cpu_count() or 1))


def _busy_ticks(cores: set[int]) -> int | None:
    """Clock ticks every process spent on our cores (all CPUs since boot), or None without /proc."""
    try:
        lines = open("/proc/stat").read().splitlines()
    except OSError:
        return None
    busy = 0
    for line in lines:
        name, *fields = line.split()
        if name.startswith("cpu") and name != "cpu" and int(name[3:]) in cores:
            values = [int(v) for v in fields]
            busy += sum(values[:8]) - values[3] - values[4]  # everything but idle and iowait
    return busy


def _own_ticks() -> int:
    times = os.times()
    return round((times.user + times.system) * os.sysconf("SC_CLK_TCK"))


def _thread_ticks(native_ids: Iterable[int]) -> int:
    """Clock ticks these threads of this process spent (one gone counts none)."""
    total = 0
    for native_id in native_ids:
        try:
            with open(f"/proc/self/task/{native_id}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])  # utime, stime
    return total


# torch's own count for a new thread (OMP_NUM_THREADS, MKL_NUM_THREADS, else MKL's physical cores), read at
# import, before any thread here sets one. Not `torch.get_num_threads()` later: torch sets a thread's count, the
# first time it runs torch, from the value any thread set last, process-wide, and the loader's and warm-up's
# `torch_on_one_thread` leave 1 there (an engine thread started after them read 1 and decoded on one core of
# two: 0.64x `generate`).
DEFAULT_THREADS = torch.get_num_threads()


class ThreadGovernor:
    """Called by the engine thread between steps; sets torch's thread count (it is per calling thread).

    `beside` names (native ids) the threads of this process that share the cores with the engine's."""

    def __init__(self, fixed_threads: int = 0, beside: Callable[[], Iterable[int]] = tuple) -> None:
        self.cores = _cores()
        self.fixed = fixed_threads > 0
        self.most = fixed_threads if self.fixed else max(1, min(DEFAULT_THREADS, len(self.cores)))
        self.threads = self.most
        self.beside = beside
        self.others_cores = 0.0  # cores other processes and the threads beside used over the last check
        self._last: tuple[float, int, int, int] | None = None
        torch.get_num_threads()  # torch's first-use set-up of this thread's count, done now: not over ours later
        torch.set_num_threads(self.threads)

    def adjust(self) -> None:
        if self.fixed:
            return
        now = time.monotonic()
        if self._last is not None and now - self._last[0] < CHECK_SECONDS:
            return
        busy = _busy_ticks(self.cores)
        if busy is None:
            self.fixed = True
            return
        own, beside = _own_ticks(), _thread_ticks(self.beside())
        if self._last is not None and now - self._last[0] <= STALE_WINDOW_SECONDS:
            then, busy_then, own_then, beside_then = self._last
            ticks = (now - then) * os.sysconf("SC_CLK_TCK")
            self.others_cores = max(0.0, ((busy - busy_then) - (own - own_then) + (beside - beside_then)) / ticks)
            taken = max(0, math.ceil(self.others_cores - BUSY_CORE_THRESHOLD))
            wanted = max(1, min(self.most, len(self.cores) - taken))
            if wanted != self.threads:
                logger.info("torch threads %d -> %d (other processes and the threads beside the engine use %.2f of "
                            "%d cores)", self.threads, wanted, self.others_cores, len(self.cores))
                self.threads = wanted
                torch.set_num_threads(wanted)
        self._last = (now, busy, own, beside)
