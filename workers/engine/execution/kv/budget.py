"""A model's KV cache budget: how many bytes its rows' keys/values, states and prefix cache may hold.

vLLM sizes its KV cache once at start (a share of the GPU's memory) and admits requests
while their blocks fit, preempting (and later recomputing) the newest when decode runs
out. The engine does the same per model over its running batch (workers/engine/execution/kv/slab.py):
the budget is `serve --kv-cache-memory` / INFERENCE_KV_CACHE_MEMORY, or else a share of
the memory free when the model has loaded (DEFAULT_SHARE: on a GPU most of it, on a CPU
half, beside everything else the machine runs). What the budget holds decides the
longest sequence the model serves: a context that does not fit is capped to what does,
so a request larger than the whole budget is a 400 saying how many tokens fit, never an
out-of-memory error. The batch counts what it holds (`SlabKV.used_bytes`: every row as
long as the batch's longest, the left-padded layout's cost), and the prefix cache's
entries give way first when rows need room.
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
class KVBudget:
    bytes: int
    token_bytes: int  # keys/values of one more token, over the layers whose cache grows with the sequence
    row_bytes: int  # what a row holds whatever its length (recurrent states, a sliding window's worth)

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


def free_memory(device: torch.device) -> int:
    """Bytes the device has free now: CUDA's own count, or the machine's available memory (/proc/meminfo)."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 8 * 1024**3  # no /proc: assume 8 GiB


def kv_budget(spec: CacheSpec, device: torch.device, configured: int | None) -> KVBudget:
    """The model's budget: `configured` bytes, or its device's share of the memory free now."""
    total = configured if configured else int(free_memory(device) * DEFAULT_SHARE.get(device.type, 0.5))
    token = sum(layer.token_bytes for layer in spec.layers if layer.kind == FULL)
    fixed = sum(layer.bytes_for(layer.window) if layer.kind == SLIDING else layer.row_bytes for layer in spec.layers
                if layer.kind != FULL)
    return KVBudget(max(0, total), token, fixed)
