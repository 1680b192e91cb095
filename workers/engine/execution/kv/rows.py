"""One sequence's cache outside the running batch: built, copied, cut out of a padded prefill.

A sequence is prefilled alone (exactly as `model.generate` would) into transformers'
own DynamicCache for the model's config: full layers grow, sliding layers keep their
window, recurrent layers their state. Before it joins the running batch
(workers/engine/execution/kv/slab.py) it may start from the prefix cache's keys/values or be cut
out of a padded prefill of several prompts; these helpers do that for every kind of
layer. Sliding layers of a prefill keep every token (transformers' "past recording"),
so the prefix cache can keep whole blocks of them and a padded prefill's rows can be
cut apart; the batch keeps only their window.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicSlidingWindowLayer, LinearAttentionLayer

from workers.engine.execution.kv.specs import SLIDING, CacheSpec


@dataclass
class RowState:
    """A recurrent layer's state for one row, per state index: convolution window and recurrent state."""
    conv: dict[int, torch.Tensor]
    recurrent: dict[int, torch.Tensor]


# What one layer of a row's cache holds: (keys, values) for attention, a RowState, or None (no cache).
RowLayer = tuple[torch.Tensor, torch.Tensor] | RowState | None


def new_row_cache(config, spec: CacheSpec) -> DynamicCache:
    """An empty cache for one prompt's prefill; its sliding layers keep every token when prompts may be
    cut out of a padded prefill or kept by the prefix cache (the batch takes only their window)."""
    cache = DynamicCache(config=config)
    if spec.has(SLIDING) and spec.prefills_padded:
        for layer in cache.layers:
            if isinstance(layer, DynamicSlidingWindowLayer):
                layer.activate_past_recording()
    return cache


def row_layers(cache: DynamicCache) -> list[RowLayer]:
    """Each layer's contents (tensors of batch 1, not copied)."""
    layers: list[RowLayer] = []
    for layer in cache.layers:
        if isinstance(layer, LinearAttentionLayer):
            layers.append(RowState(dict(layer.conv_states), dict(layer.recurrent_states)))
        elif getattr(layer, "keys", None) is not None and getattr(layer, "is_initialized", False):
            layers.append((layer.keys, layer.values))
        else:
            layers.append(None)
    return layers


def cache_from_layers(config, layers: list[RowLayer], length: int) -> DynamicCache:
    """A DynamicCache holding these layers' contents (not copied) for a sequence of `length` tokens:
    a sliding layer holding fewer than `length` tokens holds its window's last ones."""
    cache = DynamicCache(config=config)
    for layer, contents in zip(cache.layers, layers):
        if contents is None:
            continue
        if isinstance(contents, RowState):
            for index in contents.conv:
                layer.conv_states[index] = contents.conv[index]
                layer.recurrent_states[index] = contents.recurrent[index]
                layer.conv_kernel_size[index] = contents.conv[index].shape[-1]
                layer.is_conv_states_initialized[index] = layer.is_recurrent_states_initialized[index] = True
                layer.has_previous_state[index] = True
            layer.dtype, layer.device = contents.conv[0].dtype, contents.conv[0].device
            continue
        keys, values = contents
        layer.dtype, layer.device = keys.dtype, keys.device
        layer.keys, layer.values = keys, values
        layer.is_initialized = True
        if isinstance(layer, DynamicSlidingWindowLayer):
            layer.cumulative_length = length
            layer._sliding_window_tensor = layer._sliding_window_tensor.to(keys.device)
            layer.record_past = keys.shape[-2] >= length  # every token held: it may grow past its window
    return cache


def clone_cache(cache: DynamicCache) -> DynamicCache:
    return copy.deepcopy(cache)


def row_columns(config, cache: DynamicCache, row: int, start: int, first_columns: int,
                last_columns: int) -> DynamicCache:
    """One row of a padded prefill's cache whose real tokens are `first_columns` positions from `start`
    and its last `last_columns` positions (padding around them), as one single-row cache (a view when
    the first part is empty). Attention layers only: a recurrent state cannot be cut out of a batch."""
    def cut(tensor: torch.Tensor) -> torch.Tensor:
        last = tensor[row:row + 1, :, tensor.shape[-2] - last_columns:]
        if not first_columns:
            return last
        return torch.cat([tensor[row:row + 1, :, start:start + first_columns], last], dim=-2)
    layers = [None if kv is None else (cut(kv[0]), cut(kv[1])) for kv in row_layers(cache)]
    return cache_from_layers(config, layers, first_columns + last_columns)


def stack_right_aligned(config, caches: list[DynamicCache | None], lengths: list[int]) -> DynamicCache:
    """Single-row caches (None: empty) as one batch, each ending at the last column, zeros before it
    (finite padding, masked out by the caller). Attention layers only."""
    longest = max(lengths)
    per_row = [row_layers(cache) if length else None for cache, length in zip(caches, lengths)]
    template = next(layers for layers in per_row if layers is not None)
    stacked: list[RowLayer] = []
    for index, contents in enumerate(template):
        if contents is None:
            stacked.append(None)
            continue
        keys, values = contents
        if all(length == longest for length in lengths):  # nothing to pad: one copy per layer
            stacked.append((torch.cat([row[index][0] for row in per_row]), torch.cat([row[index][1] for row in per_row])))
            continue
        batch_keys = keys.new_zeros((len(caches), keys.shape[1], longest, keys.shape[3]))
        batch_values = values.new_zeros((len(caches), values.shape[1], longest, values.shape[3]))
        for row, (layers, length) in enumerate(zip(per_row, lengths)):
            if length:
                batch_keys[row, :, longest - length:] = layers[index][0][0]
                batch_values[row, :, longest - length:] = layers[index][1][0]
        stacked.append((batch_keys, batch_values))
    return cache_from_layers(config, stacked, longest)
