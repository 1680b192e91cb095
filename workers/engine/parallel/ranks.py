"""Where a model's ranks meet: what each loads, and the process group they join (with its timeout)."""
from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

import torch.distributed as dist

from workers.engine.models.model_loader import LoadOptions

# A collective that waits this long means a rank hangs: the step fails and the group is torn down.
COLLECTIVE_TIMEOUT = timedelta(seconds=30)


@dataclass(frozen=True)
class RankLoad:
    """What every follower loads: the same model, dtype and options as rank 0, and where to meet it."""

    ref: str  # protocol.ModelRef text
    device_type: str  # "cpu" or "cuda" (rank r takes cuda:r)
    dtype: str
    options: LoadOptions
    size: int
    init_method: str
    threads: int  # torch threads per CPU rank


def backend_for(device_type: str) -> str:
    return "nccl" if device_type == "cuda" else "gloo"


def init_rank(load: RankLoad, rank: int) -> None:
    """Join the group as `rank` (every rank calls this once; the call waits for all of them)."""
    dist.init_process_group(backend_for(load.device_type), init_method=load.init_method, rank=rank,
                            world_size=load.size, timeout=COLLECTIVE_TIMEOUT)
