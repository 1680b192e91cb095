"""The running batch's cache in preallocated buffers: decoding writes in place, joins copy only the newcomer.

One store per model layer, of the layer's kind (workers/engine/execution/kv/stores.py: every token
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

from workers.engine.execution.kv.rows import RowLayer, cache_from_layers, row_layers
from workers.engine.execution.mrope import rope_position_ids
from workers.engine.execution.kv.specs import FULL, NONE, SLIDING, STATE, CacheSpec
from workers.engine.execution.kv.stores import FullStore, SlidingStore, StateStore


class SlabKV:
    def __init__(self, config, spec: CacheSpec, device: torch.device, row_slots: int = 4,
                 rope_offsets: bool = False) -> None:
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
        self._positions: torch.Tensor | None = None  # `lengths` as the decode step's position ids, kept by step
        # M-RoPE models (workers/engine/execution/mrope.py): each row's rotary offset, and positions as (4, rows, …)
        self.rope_offsets = rope_offsets
        self.offsets: list[int] = []
        self._shortest = 0  # min(lengths), kept with them (whether a row is padded)
        self.holes = False  # some row has masked columns inside it (drafts rejected in a verifying step)
        self.start = self.end = 0
        self.cache = DynamicCache(config=config)  # the model's view: its layers are the stores
        self.cache.layers = self.stores
        # Static steps (workers/engine/execution/static_decode.py): zero-filled buffers, the bucket a step runs (None:
        # a step over the window), where it writes, and its inputs' persistent tensors per bucket; a
        # reallocation starts a new generation of buffers (captured steps of the old one are dropped).
        self.zeroed = False
        self.bucket: int | None = None
        self.write_column = torch.zeros(1, dtype=torch.long, device=device)
        self.generation = 0
        self._static: dict[int, StaticInputs] = {}
        self.dtype = torch.float32  # the model's (an eager model's prepared masks are additive, of its dtype)

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

    @property
    def shortest(self) -> int:
        """The shortest row's length (0 without rows)."""
        return self._shortest

    def used_bytes(self) -> int:
        """The live rows' keys/values and states (untouched spare slots and columns cost no memory on CPU)."""
        return sum(store.used_bytes() for store in self._live_stores()) if self.allocated else 0

    # --- layout --------------------------------------------------------------
    def _reallocate(self, row_slots: int, left_room: int, columns: int) -> None:
        """New buffers; the window moves to start at `left_room` (one copy of it)."""
        self.generation += 1
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
        self.generation += 1

    # --- the batch -----------------------------------------------------------
    def add(self, prefilled: list[DynamicCache], lengths: list[int], offsets: list[int] | None = None) -> None:
        """Copy freshly prefilled single-row caches (of `lengths` tokens each; M-RoPE rows' rotary `offsets`)
        into row slots after the running rows (in this order)."""
        if not prefilled:
            return
        self.offsets.extend(offsets or [0] * len(prefilled))
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
        self._rows_changed()

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
        self.compact()
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
            self.offsets[hole] = self.offsets[mover]
            order[hole] = mover
        self.lengths = self.lengths[:remaining]
        self.offsets = self.offsets[:remaining]
        self.start = self.end - max(self.lengths) if self.lengths else self.end
        self._rows_changed()
        return order

    def row_cache(self, row: int) -> DynamicCache:
        """A copy of one row's cache as its own (a paused sequence keeps it until it rejoins)."""
        self.compact()
        length = self.lengths[row]
        layers = [None if isinstance(store, DummyLayer) else store.take(row, length) for store in self.stores]
        return cache_from_layers(self.config, layers, length)

    def row_contents(self, row: int) -> list[RowLayer]:
        """One row's keys/values and states as views into the buffers (not copied: read them before the batch
        changes). Full-attention and recurrent layers only: a sliding store keeps only its window."""
        self.compact()
        length = self.lengths[row]
        return [None if isinstance(store, DummyLayer) else store.take(row, length, copy=False) for store in self.stores]

    @property
    def padded(self) -> bool:
        """Whether some row is shorter than the window (its left columns are padding)."""
        return bool(self.lengths) and self._shortest < self.length

    def _position_ids(self, index: torch.Tensor) -> torch.Tensor:
        """The forward's positions for tokens at `index` (rows, tokens): as they are, or with each row's rotary
        offset on M-RoPE's three axes."""
        if not self.rope_offsets:
            return index
        return rope_position_ids(index, index + torch.tensor(self.offsets, device=self.device)[:, None])

    def _rows_changed(self) -> None:
        self._positions = None
        self._shortest = min(self.lengths) if self.lengths else 0

    def decode_inputs(self, last_tokens: list[int], prepared_mask: bool | None = None) -> dict:
        """Model kwargs for one decode step: each row's last token at its own position.

        With padded rows and `prepared_mask` (default: the slab's), the mask goes in as SDPA's own 4D
        boolean mask, the one transformers would build from the 2D mask at every step (a tenth of
        a decode step's host time on a small model); otherwise the 2D mask, which lets transformers
        leave the mask out when nothing is padded, as `generate` does, and build each layer kind's
        own (a window's). A model of recurrent layers alone gets none: a decoded token is never padding."""
        self._ensure(self.rows, 0, 1)
        self.mask[:self.rows, self.end] = True
        ids = last_tokens if isinstance(last_tokens, torch.Tensor) else torch.tensor(last_tokens, device=self.device)
        inputs = {"input_ids": ids.unsqueeze(1), self.spec.cache_arg: self.cache}
        if self.spec.attends:
            mask = self.mask[:self.rows, self.start:self.end + 1]
            if (self.prepared_mask if prepared_mask is None else prepared_mask) and self.padded:
                mask = mask[:, None, None, :]
            inputs["attention_mask"] = mask
        if self.spec.takes_positions:
            if self._positions is None:
                self._positions = self._position_ids(torch.tensor(self.lengths, device=self.device).unsqueeze(1))
            inputs["position_ids"] = self._positions
        return inputs

    # --- verifying drafts (workers/engine/speculation/) ----------------------
    def verify_inputs(self, ids: torch.Tensor) -> dict:
        """Model kwargs for a step that feeds every row `width` tokens (its last token and its drafts, padded)
        at its own next positions, written at columns [end, end + width). Full-attention layers take any
        batch; sliding-window layers one row alone (a hole would break a window of columns being one of
        tokens); recurrent states none. The mask goes in 2D, so transformers builds the causal part (and a
        sliding layer's window) over the new columns."""
        width = ids.shape[1]
        self._ensure(self.rows, 0, width)
        self.mask[:self.rows, self.end:self.end + width] = True
        inputs = {"input_ids": ids, self.spec.cache_arg: self.cache}
        if self.spec.attends:
            inputs["attention_mask"] = self.mask[:self.rows, self.start:self.end + width]
        if self.spec.takes_positions:
            inputs["position_ids"] = self._position_ids(torch.tensor(self.lengths, device=self.device)[:, None]
                                                        + torch.arange(width, device=self.device))
        return inputs

    def commit(self, kept: list[int], width: int) -> None:
        """After a verifying step of `width` columns: row i keeps the first kept[i] (its last token and its
        accepted drafts). The window ends after the longest kept run; a row that kept fewer has the rest of its
        columns masked out (a hole inside the row: positions are the row's own, so attention is unchanged),
        closed by `compact` when the rows change or holes take half the window."""
        end, longest = self.end, max(kept)
        for row, count in enumerate(kept):
            if count < longest:
                self.mask[row, end + count:end + longest] = False
                self.holes = True
        self.mask[:self.rows, end + longest:end + width] = False
        self.end = end + longest
        for store in self.stores:
            if isinstance(store, SlidingStore):  # one row alone (no holes): its window moves by what it kept
                store.local_end += longest
        self.lengths = [length + count for length, count in zip(self.lengths, kept)]
        self._rows_changed()
        if self.holes and self.length > 2 * max(self.lengths) + 64:
            self.compact()

    def compact(self) -> None:
        """Close the holes rejected drafts left: each such row's tokens moved to end at `end` again (one copy
        of the row), its left columns padding, and the window trimmed to the longest row."""
        if not self.holes:
            return
        self.holes = False
        start, end = self.start, self.end
        for row, length in enumerate(self.lengths):
            shown = self.mask[row, start:end]
            if bool(shown[end - start - length:].all()):
                continue
            columns = shown.nonzero()[:, 0] + start
            for store in self.stores:
                if isinstance(store, FullStore):
                    store.gather(row, columns, end - length)
            self._pad(slice(row, row + 1), start, end - length)
            self.mask[row, end - length:end] = True
        self.start = end - max(self.lengths)

    def static_inputs(self, last_tokens: list[int], bucket: int) -> dict:
        """Model kwargs for one static decode step over `bucket` rows (the first `rows` real, the rest
        attending to their own new column) and every column of the buffers: tensors of fixed shapes, the
        same objects at every step of this bucket and generation of buffers, each kind's mask prepared
        (transformers builds none). The stores run the bucket until `bucket` is set back to None."""
        self._ensure(bucket, 0, 1)
        inputs = self._static.get(bucket)
        if inputs is None or inputs.generation != self.generation:
            self._static = {b: i for b, i in self._static.items() if i.generation == self.generation}
            inputs = self._static[bucket] = StaticInputs(self, bucket)
        rows, end = self.rows, self.end
        self.mask[:rows, end] = True
        lengths = torch.tensor(self.lengths + [0] * (bucket - rows), device=self.device)
        inputs.ids[:, 0] = torch.tensor(list(last_tokens) + [0] * (bucket - rows), device=self.device)
        if self.rope_offsets:
            inputs.positions[0, :, 0] = lengths
            inputs.positions[1:, :, 0] = lengths + torch.tensor(self.offsets + [0] * (bucket - rows), device=self.device)
        else:
            inputs.positions[:, 0] = lengths
        self.write_column.fill_(end)
        if inputs.full is not None:
            columns = torch.arange(self.mask.shape[1], device=self.device)
            full = self.mask[:bucket] & (columns >= self.start) & (columns <= end)
            full[rows:] = False
            full[rows:, end] = True
            inputs.set_mask(inputs.full, full[:, None, None, :])
        for store in self.stores:
            if isinstance(store, SlidingStore):
                store.prepare_static()
        for store, mask in zip(inputs.sliding_stores, inputs.sliding):  # one mask: transformers' sliding layers share one
            inputs.set_mask(mask, store.static_mask(lengths, bucket))
        self.bucket = bucket
        return inputs.model_kwargs

    def snapshot_states(self, rows: int | None = None) -> list[torch.Tensor]:
        """Copies of the recurrent states (of every row slot, or the first `rows`): a step run twice to compare
        its two forms, or a verifying step that may have to take its drafts back, starts again from them
        (keys/values are only written, never read-modified, so they need none)."""
        return [pool[:rows].clone() for store in self.stores if isinstance(store, StateStore)
                for pool in (*store.conv_pool.values(), *store.recurrent_pool.values())]

    def restore_states(self, snapshot: list[torch.Tensor]) -> None:
        pools = [pool for store in self.stores if isinstance(store, StateStore)
                 for pool in (*store.conv_pool.values(), *store.recurrent_pool.values())]
        for pool, saved in zip(pools, snapshot):
            pool[:len(saved)].copy_(saved)

    def advance(self) -> None:
        """After a decode step: every row has one more real token cached."""
        self.end += 1
        self.lengths = [length + 1 for length in self.lengths]
        self._shortest += 1
        if self._positions is not None:
            self._positions += 1
        for store in self._live_stores():
            store.advance()

    def clear(self) -> None:
        """Forget every row (after a failed step, whose writes may be half done)."""
        self.lengths, self.offsets = [], []
        self.holes = False
        self._rows_changed()
        self.start = self.end


def attends_with_sdpa(config) -> bool:
    """Whether every part of the model attends through torch's SDPA (which takes a boolean 4D mask as
    transformers builds it); other implementations want their own masks, built by transformers."""
    configs = [config, config.get_text_config()]
    return all(getattr(c, "_attn_implementation", None) == "sdpa" for c in configs)


def static_attention(config) -> bool:
    """Whether the model attends through an implementation that takes a prepared 4D mask as transformers
    builds it: SDPA's boolean mask, or eager attention's additive one."""
    return all(getattr(c, "_attn_implementation", None) in ("sdpa", "eager")
               for c in (config, config.get_text_config()))


class StaticInputs:
    """A static step's persistent inputs for one bucket of rows and one generation of buffers."""

    def __init__(self, slab: SlabKV, bucket: int) -> None:
        device, spec = slab.device, slab.spec
        self.generation = slab.generation
        self.ids = torch.zeros((bucket, 1), dtype=torch.long, device=device)
        self.positions = torch.zeros((4, bucket, 1) if slab.rope_offsets else (bucket, 1), dtype=torch.long,
                                     device=device)
        # SDPA takes a boolean mask; eager attention adds the mask to its scores: 0, or the dtype's lowest.
        self.additive = slab.config.get_text_config()._attn_implementation == "eager"
        dtype = slab.dtype if self.additive else torch.bool
        self.full = (torch.zeros((bucket, 1, 1, slab.mask.shape[1]), dtype=dtype, device=device)
                     if spec.has(FULL) else None)
        self.sliding_stores = [store for store in slab.stores if isinstance(store, SlidingStore)][:1]
        self.sliding = [torch.zeros((bucket, 1, 1, store.capacity), dtype=dtype, device=device)
                        for store in self.sliding_stores]
        self.model_kwargs = {"input_ids": self.ids, spec.cache_arg: slab.cache}
        if spec.takes_positions:
            self.model_kwargs["position_ids"] = self.positions
        masks = {"full_attention": self.full, "sliding_attention": self.sliding[0] if self.sliding else None}
        if self.full is not None and self.sliding:  # both kinds: the mapping the model's layers read by type
            types = set(getattr(slab.config.get_text_config(), "layer_types", None) or ())
            self.model_kwargs["attention_mask"] = {
                **masks, **{name: masks["sliding_attention"] if "sliding" in name or "chunked" in name
                            else masks["full_attention"] for name in types if "attention" in name and "linear" not in name}}
        elif self.full is not None or self.sliding:
            self.model_kwargs["attention_mask"] = self.full if self.full is not None else self.sliding[0]

    def set_mask(self, target: torch.Tensor, shown: torch.Tensor) -> None:
        """Write a boolean mask (True: attend) into one of the persistent masks, in its form."""
        if self.additive:
            target.copy_(torch.where(shown, 0.0, torch.finfo(target.dtype).min))
        else:
            target.copy_(shown)
