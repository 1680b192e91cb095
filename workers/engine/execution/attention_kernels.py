"""Attention kernels for multi-token steps over a grouped-query cache on CPU.

transformers' SDPA path repeats each key/value head into copies for its query heads (`repeat_kv`) whenever a
step feeds more than one token with a mask, unless the device's kernel is known to take grouped heads with a
mask (CUDA's is not). torch's CPU kernel is: `enable_gqa` with a mask gives the same output without the copies.
A verifying step feeds every row its drafts over the whole slab, so on CPU those copies were most of its time
(SmolLM2-135M, 16 rows x 5 positions over ~180 columns: 76 ms of a 311 ms step copying keys and values).
One-token steps keep transformers' own path (it folds the heads into the query, which is faster still).
"""
from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

import torch

FORCE_GQA = "TRANSFORMERS_SDPA_FORCE_GQA"  # read by transformers at every SDPA call


@contextlib.contextmanager
def grouped_query_attention(device: torch.device) -> Iterator[None]:
    """Within it, SDPA on CPU attends grouped heads without copying them (a setting already made is kept)."""
    if device.type != "cpu" or FORCE_GQA in os.environ:
        yield
        return
    os.environ[FORCE_GQA] = "1"
    try:
        yield
    finally:
        os.environ.pop(FORCE_GQA, None)
