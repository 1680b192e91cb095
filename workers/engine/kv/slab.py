"""The running batch's cache in preallocated buffers: decoding writes in place, joins copy only the newcomer.

One store per model layer, of the layer's kind (workers/engine/kv/stores.py: every token
for full attention and MLA, the window for sliding layers, a state slot for recurrent
layers), each allocated from the first row that joins. The batch is the window of
columns [start, end), left-padded so every row ends at `end`. A decode step writes
each row's new token in place; a newcomer's prefilled cache is copied into a free row
slot; a finished row's slot is refilled from the last row; trimming moves `start`.
Full stores are only reallocated (one copy of the window) when the columns run out
(growing by half the window, so amortised O(1) per token), a prompt longer than `end`
joins, or the row slots run out. On CPU the row slots are taken at once for the most
rows the engine runs (`row_slots`): untouched pages cost no memory, and rows never
have to be regrown by copying the whole cache.
"""
from __future__ import annotations

import torch
from transformers import DynamicCache
from transformers.cache_utils import DummyLayer

from workers.engine.kv.rows import cache_from_layers, row_layers
from workers.engine.kv.specs import FULL, NONE, SLIDING, STATE, CacheSpec
from workers.engine.kv.stores import FullStore, SlidingStore, StateStore


class SlabKV:
    def __init__(self, config, spec: CacheSpec, device: torch.device, row_slots: int = 4) -> None:
        self.config = config
        self.spec = spec
        self.device = device
        self.first_row_slots = max(1, row_slots)
        self.stores = [self._store(layer) for layer in spec.layers]
        self.allocated = False
        self.mask = torch.zeros((0, 0), dtype=torch.bool, device=device)  # [row slots, columns]: True = real token
        # Padded decode steps hand SDPA its 4D mask (`decode_inputs`) once the runner has seen it give the
        # same logits as transformers' own mask (None: not yet checked; False: not SDPA, windowed or
        # recurrent layers, which want masks of their own, or it did not).
        plain = all(layer.kind in (FULL, NONE) for layer in spec.layers)
        self.prepared_mask: bool | None = None if plain and attends_with_sdpa(config) else False
        self.lengths: list[int] = []  # real tokens cached per row = the next token's position
        self.start = self.end = 0
        self.cache = DynamicCache(config=config)  # the model's view: its layers are the stores
        self.cache.layers = self.stores

    def _store(self, layer):
        if layer.kind == FULL:
            return FullStore(self)
        if layer.kind == SLIDING:
            return SlidingStore(self, layer.window)
        if layer.kind == STATE:
            return StateStore(self)
        return DummyLayer()

    def _live_stores(self):
        return [store for store in self.stores if not isinstance(store, DummyLayer)]

    @property
    def rows(self) -> int:
        return len(self.lengths)

    @property
    def length(self) -> int:
        return self.end - self.start

    def used_bytes(self) -> int:
        """The live rows' keys/values and states (untouched spare slots and columns cost no memory on CPU)."""
        return sum(store.used_bytes() for store in self._live_stores()) if self.allocated else 0

    # --- layout --------------------------------------------------------------
    def _reallocate(self, row_slots: int, left_room: int, columns: int) -> None:
        """New buffers; the window moves to start at `left_room` (one copy of it)."""
        for store in self._live_stores():
            store.reallocate(row_slots, left_room, columns)
        mask = torch.zeros((row_slots, columns), dtype=torch.bool, device=self.device)
        mask[:self.rows, left_room:left_room + self.length] = self.mask[:self.rows, self.start:self.end]
        self.mask = mask
        self.start, self.end = left_room, left_room + self.length

    def _ensure(self, row_slots: int, longest_new: int, extra_columns: int) -> None:
        """Room for `row_slots` rows, a newcomer of `longest_new` tokens ending at `end`, and `extra_columns` more."""
        slots, columns = self.mask.shape
        fits_rows = row_slots <= slots
        if fits_rows and self.end >= longest_new and self.end + extra_columns <= columns:
            return
        left_room = max(0, longest_new - self.length)
        needed = left_room + self.length + extra_columns + max(64, self.length // 2)
        self._reallocate(slots if fits_rows else max(row_slots, 2 * slots), left_room, max(columns, needed))

    def _allocate(self, first_row, rows: int, longest: int) -> None:
        columns = longest + 64 + longest // 2
        slots = max(rows, self.first_row_slots)
        for store, contents in zip(self.stores, first_row):
            if not isinstance(store, DummyLayer):
                store.allocate(contents, slots, columns)
        self.mask = torch.zeros((slots, columns), dtype=torch.bool, device=self.device)
        self.allocated = True

    # --- the batch -----------------------------------------------------------
    def add(self, prefilled: list[DynamicCache], lengths: list[int]) -> None:
        """Copy freshly prefilled single-row caches (of `lengths` tokens each) into row slots after the
        running rows (in this order)."""
        if not prefilled:
            return
        contents = [row_layers(cache) for cache in prefilled]
        longest = max(lengths)
        if not self.allocated:
            self._allocate(contents[0], len(prefilled), longest)
        if not self.rows:
            self.start = self.end = max(self.start, longest)
        self._ensure(self.rows + len(prefilled), longest, 1)
        old_length = self.length
        new_start = min(self.start, self.end - longest)
        if new_start < self.start:  # older rows have nothing in the columns the window gains
            self._pad(slice(0, self.rows), new_start, self.start)
            self.start = new_start
        for store in self.stores:
            if isinstance(store, SlidingStore):
                store.widen(slice(0, self.rows), old_length)
        for row_contents, length in zip(contents, lengths):
            row = self.rows
            self._pad(slice(row, row + 1), self.start, self.end - length)
            for store, layer in zip(self.stores, row_contents):
                if not isinstance(store, DummyLayer):
                    store.place(row, layer, length)
            self.mask[row, self.end - length:self.end] = True
            self.lengths.append(length)

    def _pad(self, rows: slice, begin: int, end: int) -> None:
        """Columns [begin, end) of these rows are left padding: masked out, and finite."""
        if begin >= end:
            return
        self.mask[rows, begin:end] = False
        for store in self.stores:
            if isinstance(store, FullStore):
                store.pad(rows, begin, end)

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
            for store in self._live_stores():
                store.move(hole, mover)
            self.mask[hole, self.start:self.end] = self.mask[mover, self.start:self.end]
            self.lengths[hole] = self.lengths[mover]
            order[hole] = mover
        self.lengths = self.lengths[:remaining]
        self.start = self.end - max(self.lengths) if self.lengths else self.end
        return order

    def row_cache(self, row: int) -> DynamicCache:
        """A copy of one row's cache as its own (a paused sequence keeps it until it rejoins)."""
        length = self.lengths[row]
        layers = [None if isinstance(store, DummyLayer) else store.take(row, length) for store in self.stores]
        return cache_from_layers(self.config, layers, length)

    @property
    def padded(self) -> bool:
        """Whether some row is shorter than the window (its left columns are padding)."""
        return bool(self.lengths) and min(self.lengths) < self.length

    def decode_inputs(self, last_tokens: list[int], prepared_mask: bool | None = None) -> dict:
        """Model kwargs for one decode step: each row's last token at its own position.

        With padded rows and `prepared_mask` (default: the slab's), the mask goes in as SDPA's own 4D
        boolean mask, the one transformers would build from the 2D mask at every step (a tenth of
        a decode step's host time on a small model); otherwise the 2D mask, which lets transformers
        leave the mask out when nothing is padded, as `generate` does, and build each layer kind's
        own (a window's). A model of recurrent layers alone gets none: a decoded token is never padding."""
        self._ensure(self.rows, 0, 1)
        self.mask[:self.rows, self.end] = True
        inputs = {"input_ids": torch.tensor(last_tokens, device=self.device).unsqueeze(1),
                  self.spec.cache_arg: self.cache}
        if self.spec.attends:
            mask = self.mask[:self.rows, self.start:self.end + 1]
            if (self.prepared_mask if prepared_mask is None else prepared_mask) and self.padded:
                mask = mask[:, None, None, :]
            inputs["attention_mask"] = mask
        if self.spec.takes_positions:
            inputs["position_ids"] = torch.tensor(self.lengths, device=self.device).unsqueeze(1)
        return inputs

    def advance(self) -> None:
        """After a decode step: every row has one more real token cached."""
        self.end += 1
        self.lengths = [length + 1 for length in self.lengths]
        for store in self._live_stores():
            store.advance()

    def clear(self) -> None:
        """Forget every row (after a failed step, whose writes may be half done)."""
        self.lengths = []
        self.start = self.end


def attends_with_sdpa(config) -> bool:
    """Whether every part of the model attends through torch's SDPA (which takes a boolean 4D mask as
    transformers builds it); other implementations want their own masks, built by transformers."""
    configs = [config, config.get_text_config()]
    return all(getattr(c, "_attn_implementation", None) == "sdpa" for c in configs)
