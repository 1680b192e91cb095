"""One sequence's DynamicCache as plain tensors: wrap, copy, cut out of a padded batch.

A sequence is prefilled alone (exactly as `model.generate` would) into a
DynamicCache; these helpers move its keys/values around before it joins the
running batch (`workers/engine/kv/slab.py`).
"""
from __future__ import annotations

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer


def supports_batching(cache: DynamicCache) -> bool:
    """Only plain growing layers can be re-padded and stacked (no sliding windows, no hybrids)."""
    return bool(cache.layers) and all(type(layer) is DynamicLayer for layer in cache.layers)


def layer_tensors(cache: DynamicCache) -> list[tuple[torch.Tensor, torch.Tensor]]:
    return [(layer.keys, layer.values) for layer in cache.layers]


def cache_from_tensors(config, tensors: list[tuple[torch.Tensor, torch.Tensor]]) -> DynamicCache:
    """A DynamicCache holding these (keys, values) per layer, without copying them."""
    cache = DynamicCache(config=config)
    for layer, (keys, values) in zip(cache.layers, tensors):
        layer.dtype, layer.device = keys.dtype, keys.device
        layer.keys, layer.values = keys, values
        layer.is_initialized = True
    return cache


def clone_cache(config, cache: DynamicCache) -> DynamicCache:
    return cache_from_tensors(config, [(k.clone(), v.clone()) for k, v in layer_tensors(cache)])


def slice_rows(config, cache: DynamicCache, row: int, last_columns: int) -> DynamicCache:
    """One row of a batched cache, keeping only its last `last_columns` positions (its real tokens)."""
    return cache_from_tensors(config, [(k[row:row + 1, :, k.shape[-2] - last_columns:],
                                        v[row:row + 1, :, v.shape[-2] - last_columns:])
                                       for k, v in layer_tensors(cache)])


def join_rows(config, cache: DynamicCache, row: int, first_columns: int, last_columns: int) -> DynamicCache:
    """One row of a batched cache whose real tokens are its first `first_columns` and its last
    `last_columns` positions (padding between them), those two parts as one."""
    return cache_from_tensors(config, [
        (torch.cat([k[row:row + 1, :, :first_columns], k[row:row + 1, :, k.shape[-2] - last_columns:]], dim=-2),
         torch.cat([v[row:row + 1, :, :first_columns], v[row:row + 1, :, v.shape[-2] - last_columns:]], dim=-2))
        for k, v in layer_tensors(cache)])
