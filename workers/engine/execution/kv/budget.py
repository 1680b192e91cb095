"""A model's KV cache budget: how many bytes its rows' keys/values, states and prefix cache may hold.

vLLM sizes its KV cache once at start (a share of the GPU's memory) and admits requests
while their blocks fit, preempting (and later recomputing) the newest when decode runs
out. The engine does the same per model over its running batch (workers/engine/execution/kv/slab.py):
the budget is the model's own `kv_cache_memory` (its catalog row), else `serve
--kv-cache-memory` / INFERENCE_KV_CACHE_MEMORY, else what `--gpu-memory-utilization` leaves
(that share of the device's whole memory, less what is in use once the model has loaded:
vLLM's meaning), else a share of the memory free when the model has loaded (DEFAULT_SHARE:
on a GPU most of it, on a CPU half, beside everything else the machine runs). What the
budget holds decides the longest sequence the model serves: a context that does not fit is
capped to what does, so a request larger than the whole budget is a 400 saying how many
tokens fit, never an out-of-memory error. The batch counts what it holds
(`SlabKV.used_bytes`: every row as long as the batch's longest, the left-padded layout's
cost; a sliding layer up to its window), and the prefix cache's entries give way first when
rows need room.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

from workers.engine.execution.kv.specs import FULL, SLIDING, CacheSpec

logger = logging.getLogger(__name__)

DEFAULT_SHARE = {"cuda": 0.8, "cpu": 0.5}  # of the memory free once the model has loaded
HEADROOM_TOKENS = 16  # decode steps of growth the running rows keep room for (admission, preemption, prefix cache)


@dataclass(frozen=True)
class KVBudgetSetting:
    """Where a model's budget comes from, as the runner is told (the first that is set wins)."""

    model_bytes: int | None = None  # the model's own kv_cache_memory (its catalog row)
    server_bytes: int | None = None  # --kv-cache-memory / INFERENCE_KV_CACHE_MEMORY
    utilization: float | None = None  # --gpu-memory-utilization: a share of the device's whole memory


@dataclass(frozen=True)
class KVBudget:
    bytes: int
    token_bytes: int  # keys/values of one more token, over the layers whose cache grows with the sequence
    row_bytes: int  # what a row at its longest holds beside those (recurrent states, each sliding window full)
    source: str = "set"  # what decided it, in the words of the setting (the log line, a capped context's 400)
    windows: tuple[tuple[int, int], ...] = ()  # sliding layers: (window, their bytes a token), held up to the window

    def row_fixed(self, length: int) -> int:
        """What a row of `length` tokens holds beside its full-attention keys/values: its states, and in each
        sliding layer its last `window` tokens (fewer while it is shorter: a short row is not charged a window)."""
        return self.row_bytes - sum(max(0, window - length) * token for window, token in self.windows)

    @property
    def tokens(self) -> int:
        """How many tokens fit, over all rows (a row's fixed part aside)."""
        return self.bytes // max(1, self.token_bytes) if self.token_bytes else 10**9

    def longest(self, spec: CacheSpec) -> int:
        """The longest sequence one row can hold within the budget (10**9: its size does not grow)."""
        if not self.token_bytes:
            return 10**9 if spec.bytes_for(1) <= self.bytes else 0
        return max(0, (self.bytes - self.row_bytes) // self.token_bytes)

    def concurrency(self, spec: CacheSpec, length: int) -> float:
        """How many sequences of `length` tokens fit at once."""
        return self.bytes / max(1, spec.bytes_for(length))


def device_memory(device: torch.device) -> tuple[int, int]:
    """(free, total) bytes of the device now: CUDA's own count, or the machine's available and whole memory
    (/proc/meminfo)."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)
    found: dict[str, int] = {}
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                name, _, rest = line.partition(":")
                if name in ("MemAvailable", "MemTotal"):
                    found[name] = int(rest.split()[0]) * 1024
    except OSError:
        pass
    total = found.get("MemTotal", 16 * 1024**3)  # no /proc: assume 16 GiB, half of it free
    return found.get("MemAvailable", total // 2), total


def budget_bytes(setting: KVBudgetSetting, device: torch.device) -> tuple[int, str]:
    """The budget's bytes and what decided them."""
    if setting.model_bytes:
        return setting.model_bytes, "this model's kv_cache_memory"
    if setting.server_bytes:
        return setting.server_bytes, "the server's --kv-cache-memory"
    free, total = device_memory(device)
    if setting.utilization:
        # vLLM's --gpu-memory-utilization: the server may use this share of the whole device, the loaded
        # weights and everything else in use included; the cache gets what is left of it.
        return (int(setting.utilization * total) - (total - free),
                f"the server's --gpu-memory-utilization {setting.utilization:g}")
    share = DEFAULT_SHARE.get(device.type, 0.5)
    return int(free * share), f"{share:.0%} of free memory"


def kv_budget(spec: CacheSpec, device: torch.device, setting: KVBudgetSetting = KVBudgetSetting()) -> KVBudget:
    """The model's budget, from the first of its settings that is set."""
    total, source = budget_bytes(setting, device)
    token = sum(layer.token_bytes for layer in spec.layers if layer.kind == FULL)
    fixed = sum(layer.bytes_for(layer.window) if layer.kind == SLIDING else layer.row_bytes for layer in spec.layers
                if layer.kind != FULL)
    windows: dict[int, int] = {}
    for layer in spec.layers:
        if layer.kind == SLIDING:
            windows[layer.window] = windows.get(layer.window, 0) + layer.token_bytes
    return KVBudget(max(0, total), token, fixed, source, tuple(windows.items()))
