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


def row_columns(config, cache: DynamicCache, row: int, start: int, first_columns: int,
                last_columns: int) -> DynamicCache:
    """One row of a batched cache whose real tokens are `first_columns` positions from `start` and its
    last `last_columns` positions (padding around them), as one single-row cache (a view when the
    first part is empty)."""
    def cut(tensor: torch.Tensor) -> torch.Tensor:
        last = tensor[row:row + 1, :, tensor.shape[-2] - last_columns:]
        if not first_columns:
            return last
        return torch.cat([tensor[row:row + 1, :, start:start + first_columns], last], dim=-2)
    return cache_from_tensors(config, [(cut(k), cut(v)) for k, v in layer_tensors(cache)])


def stack_right_aligned(config, caches: list[DynamicCache | None], lengths: list[int]) -> DynamicCache:
    """Single-row caches (None: empty) as one batch, each ending at the last column, zeros before it
    (finite padding, masked out by the caller)."""
    longest = max(lengths)
    template = layer_tensors(next(cache for cache, length in zip(caches, lengths) if length))
    if all(length == longest for length in lengths):  # nothing to pad: one copy per layer
        per_row = [layer_tensors(cache) for cache in caches]
        return cache_from_tensors(config, [(torch.cat([row[index][0] for row in per_row]),
                                            torch.cat([row[index][1] for row in per_row]))
                                           for index in range(len(template))])
    stacked = []
    for index, (keys, _) in enumerate(template):
        shape = (len(caches), keys.shape[1], longest, keys.shape[3])
        batch_keys, batch_values = keys.new_zeros(shape), keys.new_zeros(shape)
        for row, (cache, length) in enumerate(zip(caches, lengths)):
            if length:
                layer = cache.layers[index]
                batch_keys[row, :, longest - length:] = layer.keys[0]
                batch_values[row, :, longest - length:] = layer.values[0]
        stacked.append((batch_keys, batch_values))
    return cache_from_tensors(config, stacked)
