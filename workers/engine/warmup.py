"""What a worker imports and initialises before it calls itself ready (issue 49: ready means ready).

A worker's first `from_pretrained` imported what transformers loads lazily — torchao above all, when it is
installed (4.4 s on a 2-core box) — so the first request after `/health` said ok took ~5 s and the next
milliseconds. Done once here, on a thread of its own at the worker's start, before its ping says it can serve.
"""
from __future__ import annotations

import contextlib
import importlib
import importlib.util
import logging
import time

logger = logging.getLogger(__name__)

# Imported by a model's first load or first step when nobody imported them before.
LAZY_MODULES = ("transformers.modeling_utils", "transformers.generation", "transformers.models.auto.modeling_auto",
                "transformers.models.auto.tokenization_auto", "transformers.quantizers.auto", "safetensors.torch")


def warm_up() -> float:
    """Import the engine and what loading and running a model import lazily, and run one tiny forward
    (torch's kernels), on one thread; the seconds it took."""
    started = time.monotonic()
    importlib.import_module("workers.engine.core.engine")
    for name in LAZY_MODULES:
        with contextlib.suppress(ImportError):
            importlib.import_module(name)
    if importlib.util.find_spec("torchao") is not None:  # transformers imports it on a first load when installed
        try:
            importlib.import_module("torchao")
        except Exception:  # a broken torchao fails the loads that ask for it, never the worker's start
            logger.warning("torchao is installed but cannot be imported", exc_info=True)
    import torch

    from workers.engine.cpu_share import torch_on_one_thread

    # Not the engine's thread: a team of OpenMP threads left behind here would make the engine's every operator
    # sleep and wake at its barriers (workers/engine/cpu_share.py): a 135M model decoded at 0.64x `generate`.
    torch_on_one_thread()
    with torch.inference_mode():
        layer = torch.nn.Linear(16, 16)
        torch.nn.functional.scaled_dot_product_attention(*(layer(torch.zeros(1, 1, 4, 16)),) * 3).softmax(-1).argmax(-1)
    took = time.monotonic() - started
    logger.info("engine warmed up in %.1fs", took)
    return took
