"""The running batch's KV cache: left-padded, rows join after their own prefill and leave when done.

Each sequence is prefilled alone (exactly as `model.generate` would), then its
keys/values are padded on the left to the batch's length and stacked in. A
finished row is dropped and the columns no remaining row uses are trimmed away.
"""
from __future__ import annotations

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer


def supports_batching(cache: DynamicCache) -> bool:
    """Only plain growing layers can be re-padded and stacked (no sliding windows, no hybrids)."""
    return bool(cache.layers) and all(type(layer) is DynamicLayer for layer in cache.layers)


def _layer_tensors(cache: DynamicCache) -> list[tuple[torch.Tensor, torch.Tensor]]:
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
    return cache_from_tensors(config, [(k.clone(), v.clone()) for k, v in _layer_tensors(cache)])


def slice_rows(config, cache: DynamicCache, row: int, last_columns: int) -> DynamicCache:
    """One row of a batched cache, keeping only its last `last_columns` positions (its real tokens)."""
    return cache_from_tensors(config, [(k[row:row + 1, :, k.shape[-2] - last_columns:],
                                        v[row:row + 1, :, v.shape[-2] - last_columns:])
                                       for k, v in _layer_tensors(cache)])


def _pad_left(tensor: torch.Tensor, amount: int) -> torch.Tensor:
    if amount == 0:
        return tensor
    shape = list(tensor.shape)
    shape[-2] = amount
    return torch.cat([tensor.new_zeros(shape), tensor], dim=-2)


class BatchedKV:
    def __init__(self, config, device: torch.device) -> None:
        self.config = config
        self.device = device
        self.cache: DynamicCache | None = None
        self.mask = torch.zeros((0, 0), dtype=torch.long, device=device)  # [rows, length]: 1 = real token
        self.lengths: list[int] = []  # real tokens cached per row = the next token's position

    @property
    def rows(self) -> int:
        return len(self.lengths)

    @property
    def length(self) -> int:
        return int(self.mask.shape[1])

    def add(self, prefilled: list[DynamicCache]) -> None:
        """Stack freshly prefilled single-row caches under the running rows (in this order)."""
        if not prefilled:
            return
        new_lengths = [cache.get_seq_length() for cache in prefilled]
        target = max([self.length, *new_lengths])
        layer_count = len(prefilled[0].layers)
        merged = []
        for index in range(layer_count):
            keys, values = [], []
            if self.rows:
                old_keys, old_values = _layer_tensors(self.cache)[index]
                keys.append(_pad_left(old_keys, target - self.length))
                values.append(_pad_left(old_values, target - self.length))
            for cache, length in zip(prefilled, new_lengths):
                new_keys, new_values = _layer_tensors(cache)[index]
                keys.append(_pad_left(new_keys, target - length))
                values.append(_pad_left(new_values, target - length))
            merged.append((torch.cat(keys, dim=0), torch.cat(values, dim=0)))
        masks = [] if not self.rows else [_pad_left(self.mask.unsqueeze(-1), target - self.length).squeeze(-1)]
        for length in new_lengths:
            row = torch.zeros((1, target), dtype=torch.long, device=self.device)
            row[0, target - length:] = 1
            masks.append(row)
        self.mask = torch.cat(masks, dim=0)
        self.lengths.extend(new_lengths)
        self._install(merged)

    def keep(self, rows: list[int]) -> None:
        """Drop every row not listed; trim the left columns no remaining row needs."""
        if len(rows) == self.rows:
            return
        if not rows:
            self.cache, self.lengths = None, []
            self.mask = torch.zeros((0, 0), dtype=torch.long, device=self.device)
            return
        index = torch.tensor(rows, device=self.device)
        self.mask = self.mask.index_select(0, index)
        self.lengths = [self.lengths[i] for i in rows]
        start = self.length - max(self.lengths)
        self.mask = self.mask[:, start:]
        self._install([(k.index_select(0, index)[:, :, start:], v.index_select(0, index)[:, :, start:])
                       for k, v in _layer_tensors(self.cache)])

    def _install(self, tensors: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        self.cache = cache_from_tensors(self.config, [(k.contiguous(), v.contiguous()) for k, v in tensors])

    def decode_inputs(self, last_tokens: list[int]) -> dict:
        """Model kwargs for one decode step: each row's last token at its own position."""
        ones = torch.ones((self.rows, 1), dtype=torch.long, device=self.device)
        return {
            "input_ids": torch.tensor(last_tokens, device=self.device).unsqueeze(1),
            "attention_mask": torch.cat([self.mask, ones], dim=1),
            "position_ids": torch.tensor(self.lengths, device=self.device).unsqueeze(1),
            "cache_position": torch.tensor([self.length], device=self.device),
            "past_key_values": self.cache,
        }

    def advance(self) -> None:
        """After a decode step: every row has one more real token cached."""
        ones = torch.ones((self.rows, 1), dtype=torch.long, device=self.device)
        self.mask = torch.cat([self.mask, ones], dim=1)
        self.lengths = [length + 1 for length in self.lengths]
