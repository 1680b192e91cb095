"""A model's ranks: follower processes, the process group that joins them, and the pipe of ops to them.

Rank 0 is the worker's own process (its loader thread loads the shard, its engine thread runs the
forwards); ranks 1..N-1 are processes forked from a fork server (`follower.py`), one per device. The
forwards' collectives go over `torch.distributed` (NCCL on CUDA, gloo on CPU) with a timeout, so a rank that hangs never holds
the others past it; the ops go over a pipe per follower, which a follower reads without a timeout while
the model is idle and which tells it when rank 0 is gone. A follower that dies closes its sockets: the
next collective on rank 0 raises at once, and the engine tears the group down and loads the model again.
"""
from __future__ import annotations

import logging
import multiprocessing
import os
import pickle
import socket
import time

import torch
import torch.distributed as dist

from workers.engine.errors import ModelLoadError
from workers.engine.models.model_loader import LoadOptions
from workers.engine.parallel.follower import follower_main
from workers.engine.parallel.ranks import RankLoad, backend_for, init_rank

logger = logging.getLogger(__name__)

STOP_WAIT_SECONDS = 5.0  # a follower asked to stop gets this long before it is killed
LOAD_WAIT_SECONDS = 600.0  # after rank 0 loaded its shard, the longest a follower may take to load its own

def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class TensorParallelGroup:
    """The followers of one model and the process group; rank 0's handle on them."""

    def __init__(self, load: RankLoad, processes: list, conns: list) -> None:
        self.load = load
        self.size = load.size
        self.processes = processes
        self.conns = conns
        self.follower_bytes: list[int] = []  # each follower's weights, once loaded
        self.closed = False

    @classmethod
    def start(cls, ref: str, device: torch.device, dtype: str, options: LoadOptions) -> "TensorParallelGroup":
        """Spawn ranks 1..N-1 (each starts loading its shard) and join them as rank 0."""
        size = options.tensor_parallel_size
        if dist.is_available() and dist.is_initialized():
            raise ModelLoadError(f"The model `{ref}` cannot be served with tensor_parallel_size={size}: this worker "
                                 "runs a tensor-parallel model already (one per worker process; unload it first, or "
                                 "start another worker).")
        threads = max(1, (os.cpu_count() or 1) // size)
        load = RankLoad(ref, device.type, dtype, options, size, f"tcp://127.0.0.1:{_free_port()}", threads)
        # never fork the worker (its threads hold locks): a fork server, started once with torch and transformers
        # imported, forks each follower clean (a reload after a fault starts in a fraction of a second)
        context = multiprocessing.get_context("forkserver")
        context.set_forkserver_preload(["workers.engine.parallel.follower", "transformers"])
        processes, conns = [], []
        for rank in range(1, size):
            parent, child = context.Pipe()
            process = context.Process(target=follower_main, args=(rank, load, child), name=f"tp-rank-{rank}",
                                      daemon=True)
            process.start()
            child.close()
            processes.append(process)
            conns.append(parent)
        group = cls(load, processes, conns)
        try:
            init_rank(load, 0)
        except Exception as exc:
            group.close()
            raise ModelLoadError(f"The model `{ref}`'s tensor-parallel ranks did not meet: "
                                 f"{group.follower_error() or exc}") from exc
        logger.info("%s: tensor parallel over %d ranks (%s, %s)", ref, size, backend_for(device.type),
                    ", ".join(f"rank {r} pid {p.pid}" for r, p in enumerate(processes, start=1)))
        return group

    def wait_loaded(self) -> None:
        """After rank 0's own load: every follower's shard is loaded too (else its error, raised)."""
        deadline = time.monotonic() + LOAD_WAIT_SECONDS
        for rank, conn in enumerate(self.conns, start=1):
            while not conn.poll(0.2):
                if not self.processes[rank - 1].is_alive():
                    raise ModelLoadError(f"tensor-parallel rank {rank} exited while loading "
                                         f"(code {self.processes[rank - 1].exitcode})")
                if time.monotonic() > deadline:
                    raise ModelLoadError(f"tensor-parallel rank {rank} did not load its shard within "
                                         f"{LOAD_WAIT_SECONDS:.0f} s of rank 0")
            try:
                kind, value = conn.recv()
            except (EOFError, OSError) as exc:
                raise ModelLoadError(f"tensor-parallel rank {rank} exited while loading") from exc
            if kind == "error":
                raise ModelLoadError(value)
            self.follower_bytes.append(int(value))

    def follower_error(self) -> str | None:
        """The first load error a follower reported (after rank 0's load failed: often the same one)."""
        deadline = time.monotonic() + 2.0
        for conn in self.conns:
            try:
                while time.monotonic() < deadline and conn.poll(0.1):
                    kind, value = conn.recv()
                    if kind == "error":
                        return value
            except (EOFError, OSError):
                continue
        return None

    def send(self, ops: list[tuple]) -> None:
        """The ops the followers run next, in order (one message per forward)."""
        data = pickle.dumps(ops, protocol=pickle.HIGHEST_PROTOCOL)
        for conn in self.conns:
            conn.send_bytes(data)

    def problem(self, wait: float = 0.0) -> str | None:
        """Why the group cannot serve (a follower exited), or None; `wait`: after a failed collective, how long
        a dead rank may take to be seen as exited (its sockets close before its exit is reported)."""
        deadline = time.monotonic() + wait
        while True:
            for rank, process in enumerate(self.processes, start=1):
                if not process.is_alive():
                    return f"tensor-parallel rank {rank} exited (code {process.exitcode})"
            if time.monotonic() >= deadline:
                return None
            time.sleep(0.02)

    def close(self) -> None:
        """Stop the followers (asked, then killed) and leave the process group."""
        if self.closed:
            return
        self.closed = True
        try:
            self.send([("stop",)])
        except (OSError, ValueError):
            pass
        deadline = time.monotonic() + STOP_WAIT_SECONDS
        for process in self.processes:
            process.join(max(0.0, deadline - time.monotonic()))
            if process.is_alive():
                process.kill()
                process.join(1.0)
        for conn in self.conns:
            conn.close()
        if dist.is_initialized():
            try:
                dist.destroy_process_group()
            except Exception:  # a group whose peer died may not shut down cleanly; it is gone either way
                logger.exception("leaving the tensor-parallel process group")
        logger.info("%s: tensor-parallel ranks stopped", self.load.ref)
