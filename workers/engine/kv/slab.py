"""The running batch's KV cache in preallocated buffers: decoding writes in place, joins copy only the newcomer.

The old batch cache grew every layer with `torch.cat` at every decode step and
re-padded every row whenever one joined or left, copying the whole cache each
time. Here each layer's keys/values live in buffers of [row slots, heads,
columns, head dim]; the batch is the window of columns [start, end), left-padded
so every row ends at `end`. A decode step writes each row's new token at column
`end` in place; a newcomer's prefilled cache is copied into a free row slot; a
finished row's slot is refilled from the last row; trimming moves `start`. The
buffers are only reallocated (one copy of the window) when the columns run out
(growing by half the window, so amortised O(1) per token), a prompt longer than
`end` joins, or the row slots run out.

Buffers are allocated empty, not zeroed: zero-filling gigabytes of spare rows
and columns stalled every stream for seconds when a long prompt joined. Only
columns inside the window are ever read, and each is written before it is read:
a row's own tokens, decode steps' columns, and zeros written for a row's left
padding. Keys/values there must be finite, as attention weighs padding by 0 and
0 × NaN is NaN. On CPU the row slots are taken at once for the most rows the
engine runs (`row_slots`): untouched pages cost no memory, and rows never have to
be regrown by copying the whole cache.
"""
from __future__ import annotations

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from workers.engine.kv.batch import cache_from_tensors, layer_tensors


class SlabLayer(DynamicLayer):
    """One model layer's view of the slab; `update` writes at the slab's `end` column in place."""

    def __init__(self, slab: "SlabKV", index: int) -> None:
        super().__init__()
        self.slab, self.index = slab, index
        self.is_initialized = True

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        slab = self.slab
        width = key_states.shape[-2]
        keys, values = slab.keys[self.index], slab.values[self.index]
        keys[:slab.rows, :, slab.end:slab.end + width] = key_states
        values[:slab.rows, :, slab.end:slab.end + width] = value_states
        return keys[:slab.rows, :, slab.start:slab.end + width], values[:slab.rows, :, slab.start:slab.end + width]

    def get_seq_length(self) -> int:
        return self.slab.end - self.slab.start


class SlabKV:
    def __init__(self, config, device: torch.device, row_slots: int = 4) -> None:
        self.config = config
        self.device = device
        self.first_row_slots = max(1, row_slots)
        self.keys: list[torch.Tensor] = []  # per layer [row slots, kv heads, columns, head dim]
        self.values: list[torch.Tensor] = []
        self.mask = torch.zeros((0, 0), dtype=torch.bool, device=device)  # [row slots, columns]: True = real token
        # Padded decode steps hand SDPA its 4D mask (`decode_inputs`) once the runner has seen it give the
        # same logits as transformers' own mask (None: not yet checked; False: not SDPA, or it did not).
        self.prepared_mask: bool | None = None if attends_with_sdpa(config) else False
        self.lengths: list[int] = []  # real tokens cached per row = the next token's position
        self.start = self.end = 0
        self.cache: DynamicCache | None = None

    @property
    def rows(self) -> int:
        return len(self.lengths)

    @property
    def length(self) -> int:
        return self.end - self.start

    def used_bytes(self) -> int:
        """Keys/values of the live rows' window (untouched spare slots and columns cost no memory on CPU)."""
        return sum(t[:self.rows, :, self.start:self.end].numel() * t.element_size() for t in self.keys + self.values)

    # --- layout --------------------------------------------------------------
    def _reallocate(self, row_slots: int, left_room: int, columns: int) -> None:
        """New buffers; the window moves to start at `left_room` (one copy of it)."""
        window = self.length
        heads, dim, dtype = self.keys[0].shape[1], self.keys[0].shape[3], self.keys[0].dtype
        moved_keys, moved_values = [], []
        for old_keys, old_values in zip(self.keys, self.values):
            new_keys = torch.empty((row_slots, heads, columns, dim), dtype=dtype, device=self.device)
            new_values = torch.empty_like(new_keys)
            new_keys[:self.rows, :, left_room:left_room + window] = old_keys[:self.rows, :, self.start:self.end]
            new_values[:self.rows, :, left_room:left_room + window] = old_values[:self.rows, :, self.start:self.end]
            moved_keys.append(new_keys)
            moved_values.append(new_values)
        mask = torch.zeros((row_slots, columns), dtype=torch.bool, device=self.device)
        mask[:self.rows, left_room:left_room + window] = self.mask[:self.rows, self.start:self.end]
        self.keys, self.values, self.mask = moved_keys, moved_values, mask
        self.start, self.end = left_room, left_room + window

    def _ensure(self, row_slots: int, longest_new: int, extra_columns: int) -> None:
        """Room for `row_slots` rows, a newcomer of `longest_new` tokens ending at `end`, and `extra_columns` more."""
        slots, columns = self.mask.shape
        fits_rows = row_slots <= slots
        if fits_rows and self.end >= longest_new and self.end + extra_columns <= columns:
            return
        left_room = max(0, longest_new - self.length)
        needed = left_room + self.length + extra_columns + max(64, self.length // 2)
        self._reallocate(slots if fits_rows else max(row_slots, 2 * slots), left_room, max(columns, needed))

    def _view(self) -> None:
        """The model's view of the slab, made once: its layers read the slab's buffers and window when
        called, so it stays true through joins, leaves and reallocations (building a DynamicCache from
        the config costs ~40 us, once a step before)."""
        if self.cache is None or len(self.cache.layers) != len(self.keys):
            self.cache = DynamicCache(config=self.config)
            self.cache.layers = [SlabLayer(self, index) for index in range(len(self.keys))]

    # --- the batch -----------------------------------------------------------
    def add(self, prefilled: list[DynamicCache]) -> None:
        """Copy freshly prefilled single-row caches into row slots after the running rows (in this order)."""
        if not prefilled:
            return
        tensors = [layer_tensors(cache) for cache in prefilled]
        new_lengths = [cache.get_seq_length() for cache in prefilled]
        if not self.keys:
            self._first_allocation(tensors[0], len(prefilled), max(new_lengths))
        if not self.rows:
            self.start = self.end = max(self.start, max(new_lengths))
        self._ensure(self.rows + len(prefilled), max(new_lengths), 1)
        new_start = min(self.start, self.end - max(new_lengths))
        if new_start < self.start:  # older rows have nothing in the columns the window gains
            self._pad(slice(0, self.rows), new_start, self.start)
            self.start = new_start
        for row_tensors, length in zip(tensors, new_lengths):
            row = self.rows
            self._pad(slice(row, row + 1), self.start, self.end - length)
            for index, (keys, values) in enumerate(row_tensors):
                self.keys[index][row, :, self.end - length:self.end] = keys[0]
                self.values[index][row, :, self.end - length:self.end] = values[0]
            self.mask[row, self.end - length:self.end] = True
            self.lengths.append(length)
        self._view()

    def _pad(self, rows: slice, begin: int, end: int) -> None:
        """Columns [begin, end) of these rows are left padding: masked out, and finite."""
        if begin >= end:
            return
        self.mask[rows, begin:end] = False
        for keys, values in zip(self.keys, self.values):
            keys[rows, :, begin:end] = 0
            values[rows, :, begin:end] = 0

    def _first_allocation(self, layers: list[tuple[torch.Tensor, torch.Tensor]], rows: int, longest: int) -> None:
        columns = longest + 64 + longest // 2
        slots = max(rows, self.first_row_slots)
        for keys, _ in layers:
            shape = (slots, keys.shape[1], columns, keys.shape[3])
            self.keys.append(torch.empty(shape, dtype=keys.dtype, device=self.device))
            self.values.append(torch.empty(shape, dtype=keys.dtype, device=self.device))
        self.mask = torch.zeros((slots, columns), dtype=torch.bool, device=self.device)

    def remove(self, dead: list[int]) -> list[int]:
        """Drop these rows; returns, for each remaining row in its new place, its old row index.

        Each hole below the new row count takes the last live row (one row copied per hole).
        """
        if not dead:
            return list(range(self.rows))
        dead_set = set(dead)
        order = [row for row in range(self.rows) if row not in dead_set]
        remaining = len(order)
        movers = [row for row in order if row >= remaining]
        holes = [row for row in sorted(dead_set) if row < remaining]
        order = list(range(remaining))
        for hole, mover in zip(holes, movers):
            for keys, values in zip(self.keys, self.values):
                keys[hole, :, self.start:self.end] = keys[mover, :, self.start:self.end]
                values[hole, :, self.start:self.end] = values[mover, :, self.start:self.end]
            self.mask[hole, self.start:self.end] = self.mask[mover, self.start:self.end]
            self.lengths[hole] = self.lengths[mover]
            order[hole] = mover
        self.lengths = self.lengths[:remaining]
        self.start = self.end - max(self.lengths) if self.lengths else self.end
        self._view()
        return order

    def row_cache(self, row: int) -> DynamicCache:
        """A copy of one row's keys/values as its own cache (a paused sequence keeps it until it rejoins)."""
        length = self.lengths[row]
        return cache_from_tensors(self.config, [
            (keys[row:row + 1, :, self.end - length:self.end].clone(), values[row:row + 1, :, self.end - length:self.end].clone())
            for keys, values in zip(self.keys, self.values)])

    @property
    def padded(self) -> bool:
        """Whether some row is shorter than the window (its left columns are padding)."""
        return bool(self.lengths) and min(self.lengths) < self.length

    def decode_inputs(self, last_tokens: list[int], prepared_mask: bool | None = None) -> dict:
        """Model kwargs for one decode step: each row's last token at its own position.

        With padded rows and `prepared_mask` (default: the slab's), the mask goes in as SDPA's own 4D
        boolean mask, the one transformers would build from the 2D mask at every step (a tenth of
        a decode step's host time on a small model); otherwise the 2D mask, which lets transformers
        leave the mask out when nothing is padded, as `generate` does."""
        self._ensure(self.rows, 0, 1)
        self.mask[:self.rows, self.end] = True
        self._view()
        mask = self.mask[:self.rows, self.start:self.end + 1]
        if (self.prepared_mask if prepared_mask is None else prepared_mask) and self.padded:
            mask = mask[:, None, None, :]
        return {
            "input_ids": torch.tensor(last_tokens, device=self.device).unsqueeze(1),
            "attention_mask": mask,
            "position_ids": torch.tensor(self.lengths, device=self.device).unsqueeze(1),
            "cache_position": torch.tensor([self.length], device=self.device),
            "past_key_values": self.cache,
        }

    def advance(self) -> None:
        """After a decode step: every row has one more real token cached."""
        self.end += 1
        self.lengths = [length + 1 for length in self.lengths]


def attends_with_sdpa(config) -> bool:
    """Whether every part of the model attends through torch's SDPA (which takes a boolean 4D mask as
    transformers builds it); other implementations want their own masks, built by transformers."""
    configs = [config, config.get_text_config()]
    return all(getattr(c, "_attn_implementation", None) == "sdpa" for c in configs)
