"""How busy the GPU is while a run goes on: the driver's utilization (the share of time a kernel ran), sampled.

Device-wide, so it sees the server's process as well as the benchmark's own. `torch.cuda.utilization`
where it works (it needs NVML's Python binding), else `nvidia-smi`; on CPU, or with neither, no figure.
"""
from __future__ import annotations

import shutil
import statistics
import subprocess
import threading
import time
from collections.abc import Callable


def _torch_reader(device: str) -> Callable[[], float] | None:
    import torch

    try:
        torch.cuda.utilization(device)
    except Exception:  # no NVML binding (pynvml / nvidia-ml-py), or no driver
        return None
    return lambda: float(torch.cuda.utilization(device))


def _smi_reader(device: str) -> Callable[[], float] | None:
    smi = shutil.which("nvidia-smi")
    if not smi:
        return None
    index = device.partition(":")[2] or "0"
    command = [smi, "--query-gpu=utilization.gpu", "--format=csv,noheader,nounits", "-i", index]

    def read() -> float:
        return float(subprocess.run(command, capture_output=True, text=True, timeout=5, check=True).stdout.split()[0])

    try:
        read()
    except Exception:
        return None
    return read


class GpuBusy:
    """A thread sampling utilization every `period` seconds; `busy_pct(t0, t1)` is the mean over a window."""

    def __init__(self, device: str, period: float = 0.1) -> None:
        self.samples: list[tuple[float, float]] = []
        self.source: str | None = None
        self.read: Callable[[], float] | None = None
        if device.startswith("cuda"):
            for name, reader in (("torch.cuda.utilization", _torch_reader), ("nvidia-smi", _smi_reader)):
                self.read = reader(device)
                if self.read:
                    self.source = name
                    break
        self.period = period
        self.stopped = threading.Event()
        if self.read:
            threading.Thread(target=self._run, name="gpu-busy", daemon=True).start()

    def _run(self) -> None:
        while not self.stopped.is_set():
            try:
                self.samples.append((time.monotonic(), self.read()))
            except Exception:  # a sample missed is a sample missed
                pass
            self.stopped.wait(self.period)

    def busy_pct(self, started: float, ended: float) -> float | None:
        """Mean utilization between two `time.monotonic()` readings; None where nothing was sampled."""
        window = [value for at, value in self.samples if started <= at <= ended]
        return round(statistics.fmean(window), 1) if window else None

    def stop(self) -> None:
        self.stopped.set()
