"""The running batch's cache, one store per model layer and one kind of store per kind of layer.

Each store is also the layer transformers' model code talks to (`update`, `get_mask_sizes`,
`get_conv_state`…): a decode step writes each row's new token in place and reads the
batch's rows as one tensor. The batch (workers/engine/execution/kv/slab.py) is left-padded: every
row's tokens end at the same column, so a column's distance from the end is a token's
distance from the row's last one, for every row, and a sliding window in columns is
the same window for every row.

- FullStore: every token's keys and values (MLA: keys and values of their own widths),
  in the slab's columns [start, end).
- SlidingStore: only the last `window - 1` columns, in a buffer of its own that is
  shifted back to its front when its spare columns run out (one copy of a window per
  64 steps). Transformers builds the window's mask from its `get_mask_sizes`.
- StateStore: a recurrent layer's fixed-size state (convolution window, recurrent
  state), one slot per row; the model updates the batch's slots in place.

Buffers are allocated empty, never zero-filled: only columns inside a row's window are
read, and each is written first (a token's keys/values, or zeros for left padding).

In a static step (workers/engine/execution/static_decode.py) every store hands the model its whole
buffer for a fixed bucket of rows instead of the window, writes at a position held in a
device tensor, and the slab builds each kind's mask: the same shapes at every step, so a
step can be captured once and replayed. Its buffers are then zero-filled when allocated
(columns outside a row's window are read, weighed 0, and must be finite).
"""
from __future__ import annotations

from typing import Protocol

import torch
from transformers.cache_utils import DynamicLayer, LinearAttentionLayer

from workers.engine.execution.kv.rows import RowState


class SlabKV(Protocol):
    """What a store reads of its batch (workers/engine/execution/kv/slab.py): its rows and its columns [start, end),
    and in a static step the bucket of rows it runs (None: a step over the window) and where it writes."""

    @property
    def rows(self) -> int: ...

    @property
    def length(self) -> int: ...

    start: int
    end: int
    bucket: int | None
    write_column: torch.Tensor  # [1]: `end`, on the device
    zeroed: bool  # buffers are zero-filled when allocated (static steps read outside the window)


def _new(like: torch.Tensor, shape: tuple[int, ...], zeroed: bool) -> torch.Tensor:
    return like.new_zeros(shape) if zeroed else like.new_empty(shape)

_EMPTY = torch.empty(0)  # what a store's `keys`/`values` show: its tensors are its buffers, not these
SPARE_WINDOW_COLUMNS = 64  # a sliding store's columns past its window: one shift per this many steps


class FullStore(DynamicLayer):
    """One full-attention layer: [row slots, heads, columns, head dim] for keys and for values."""

    def __init__(self, slab: SlabKV) -> None:
        super().__init__()
        self.slab = slab
        self.key_buffer: torch.Tensor | None = None
        self.value_buffer: torch.Tensor | None = None
        self.is_initialized = True
        self.keys = self.values = _EMPTY  # as transformers' layers show before their first update: read by
        # models that look into a layer (Mllama's decoder asks whether each holds cross-attention states)

    # --- the slab's side -----------------------------------------------------
    def allocate(self, contents: tuple[torch.Tensor, torch.Tensor], slots: int, columns: int) -> None:
        keys, values = contents
        zeroed = self.slab.zeroed
        self.key_buffer = _new(keys, (slots, keys.shape[1], columns, keys.shape[3]), zeroed)
        self.value_buffer = _new(values, (slots, values.shape[1], columns, values.shape[3]), zeroed)

    def reallocate(self, slots: int, left_room: int, columns: int) -> None:
        """New buffers; the window moves to start at `left_room` (one copy of it)."""
        slab = self.slab
        old_keys, old_values = self.key_buffer, self.value_buffer
        self.allocate((old_keys, old_values), slots, columns)
        window = slice(left_room, left_room + slab.length)
        self.key_buffer[:slab.rows, :, window] = old_keys[:slab.rows, :, slab.start:slab.end]
        self.value_buffer[:slab.rows, :, window] = old_values[:slab.rows, :, slab.start:slab.end]

    def place(self, row: int, contents: tuple[torch.Tensor, torch.Tensor], length: int) -> None:
        end = self.slab.end
        self.key_buffer[row, :, end - length:end] = contents[0][0, :, -length:]
        self.value_buffer[row, :, end - length:end] = contents[1][0, :, -length:]

    def pad(self, rows: slice, begin: int, end: int) -> None:
        self.key_buffer[rows, :, begin:end] = 0
        self.value_buffer[rows, :, begin:end] = 0

    def move(self, hole: int, mover: int) -> None:
        window = slice(self.slab.start, self.slab.end)
        self.key_buffer[hole, :, window] = self.key_buffer[mover, :, window]
        self.value_buffer[hole, :, window] = self.value_buffer[mover, :, window]

    def gather(self, row: int, columns: torch.Tensor, to: int) -> None:
        """Move one row's `columns` (its real tokens, in order) to [to, to + len(columns)): closes holes."""
        width = len(columns)
        self.key_buffer[row, :, to:to + width] = self.key_buffer[row, :, columns]
        self.value_buffer[row, :, to:to + width] = self.value_buffer[row, :, columns]

    def take(self, row: int, length: int, copy: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
        end = self.slab.end
        keys, values = (self.key_buffer[row:row + 1, :, end - length:end],
                        self.value_buffer[row:row + 1, :, end - length:end])
        return (keys.clone(), values.clone()) if copy else (keys, values)

    def used_bytes(self) -> int:
        slab = self.slab
        return sum(t[:slab.rows, :, slab.start:slab.end].numel() * t.element_size()
                   for t in (self.key_buffer, self.value_buffer))

    def advance(self) -> None:
        pass

    # --- the model's side ----------------------------------------------------
    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        slab = self.slab
        if slab.bucket is not None:  # a static step: every column of a bucket of rows
            keys, values = self.key_buffer[:slab.bucket], self.value_buffer[:slab.bucket]
            keys.index_copy_(2, slab.write_column, key_states)
            values.index_copy_(2, slab.write_column, value_states)
            return keys, values
        width = key_states.shape[-2]
        self.key_buffer[:slab.rows, :, slab.end:slab.end + width] = key_states
        self.value_buffer[:slab.rows, :, slab.end:slab.end + width] = value_states
        columns = slice(slab.start, slab.end + width)
        return self.key_buffer[:slab.rows, :, columns], self.value_buffer[:slab.rows, :, columns]

    def get_seq_length(self) -> int:
        return self.slab.length

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.slab.length + query_length, 0


class SlidingStore(DynamicLayer):
    """One sliding-window layer: the last `window - 1` columns of every row, ending at `local_end`."""

    is_sliding = True

    def __init__(self, slab: SlabKV, window: int) -> None:
        super().__init__()
        self.slab = slab
        self.sliding_window = window
        self.keep = max(1, window - 1)
        self.capacity = self.keep + SPARE_WINDOW_COLUMNS
        self.local_end = self.keep
        self.key_buffer: torch.Tensor | None = None
        self.value_buffer: torch.Tensor | None = None
        self.write_index: torch.Tensor | None = None  # [1]: `local_end` on the device, for static steps
        self.is_initialized = True
        self.keys = self.values = _EMPTY

    def visible(self, length: int | None = None) -> int:
        """Columns the window shows for a batch of `length` columns (default: the slab's)."""
        return min(self.keep, self.slab.length if length is None else length)

    # --- the slab's side -----------------------------------------------------
    def allocate(self, contents: tuple[torch.Tensor, torch.Tensor], slots: int, columns: int = 0) -> None:
        keys, values = contents
        zeroed = self.slab.zeroed
        self.key_buffer = _new(keys, (slots, keys.shape[1], self.capacity, keys.shape[3]), zeroed)
        self.value_buffer = _new(values, (slots, values.shape[1], self.capacity, values.shape[3]), zeroed)
        self.write_index = torch.zeros(1, dtype=torch.long, device=keys.device)

    def reallocate(self, slots: int, left_room: int = 0, columns: int = 0) -> None:
        if slots <= self.key_buffer.shape[0]:
            return
        old_keys, old_values = self.key_buffer, self.value_buffer
        self.allocate((old_keys, old_values), slots)
        rows = self.slab.rows
        self.key_buffer[:rows] = old_keys[:rows]
        self.value_buffer[:rows] = old_values[:rows]

    def place(self, row: int, contents: tuple[torch.Tensor, torch.Tensor], length: int) -> None:
        """A newcomer of `length` tokens (its layer holds at least their last `visible` ones), after the
        slab's window took its final length; the window's columns before its tokens are padding."""
        held = min(self.visible(), length)
        end = self.local_end
        self.key_buffer[row, :, end - held:end] = contents[0][0, :, -held:]
        self.value_buffer[row, :, end - held:end] = contents[1][0, :, -held:]
        self._zero(slice(row, row + 1), end - self.visible(), end - held)

    def widen(self, rows: slice, old_length: int) -> None:
        """The slab's window grew from `old_length` columns: these rows' newly shown columns are padding."""
        self._zero(rows, self.local_end - self.visible(), self.local_end - self.visible(old_length))

    def _zero(self, rows: slice, begin: int, end: int) -> None:
        if begin < end:
            self.key_buffer[rows, :, begin:end] = 0
            self.value_buffer[rows, :, begin:end] = 0

    def move(self, hole: int, mover: int) -> None:
        shown = slice(self.local_end - self.visible(), self.local_end)
        self.key_buffer[hole, :, shown] = self.key_buffer[mover, :, shown]
        self.value_buffer[hole, :, shown] = self.value_buffer[mover, :, shown]

    def take(self, row: int, length: int) -> tuple[torch.Tensor, torch.Tensor]:
        held = min(self.keep, length)
        shown = slice(self.local_end - held, self.local_end)
        return self.key_buffer[row:row + 1, :, shown].clone(), self.value_buffer[row:row + 1, :, shown].clone()

    def used_bytes(self) -> int:
        rows, shown = self.slab.rows, slice(self.local_end - self.visible(), self.local_end)
        return sum(t[:rows, :, shown].numel() * t.element_size() for t in (self.key_buffer, self.value_buffer))

    def advance(self) -> None:
        self.local_end += 1

    def _shift(self, width: int) -> None:
        """Room for `width` more columns: the shown window moves to the buffer's front."""
        if self.local_end + width <= self.capacity:
            return
        rows, shown = self.slab.rows, self.visible()
        source = slice(self.local_end - shown, self.local_end)
        target = slice(self.keep - shown, self.keep)
        self.key_buffer[:rows, :, target] = self.key_buffer[:rows, :, source].clone()
        self.value_buffer[:rows, :, target] = self.value_buffer[:rows, :, source].clone()
        self.local_end = self.keep

    def prepare_static(self) -> None:
        """Before a static step: room for its column, and where it goes, on the device."""
        self._shift(1)
        self.write_index.fill_(self.local_end)

    def static_mask(self, lengths: torch.Tensor, bucket: int) -> torch.Tensor:
        """[bucket, 1, 1, capacity]: each row's window in this buffer (its last `keep` tokens or fewer, and
        the step's new one); rows past `lengths` attend to the new column alone."""
        columns = torch.arange(self.capacity, device=lengths.device)
        lower = self.local_end - torch.clamp(lengths, max=self.keep)
        shown = (columns[None, :] >= lower[:, None]) & (columns[None, :] <= self.local_end)
        return shown[:, None, None, :]

    # --- the model's side ----------------------------------------------------
    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if self.slab.bucket is not None:  # a static step: the whole buffer of a bucket of rows
            keys, values = self.key_buffer[:self.slab.bucket], self.value_buffer[:self.slab.bucket]
            keys.index_copy_(2, self.write_index, key_states)
            values.index_copy_(2, self.write_index, value_states)
            return keys, values
        width = key_states.shape[-2]
        self._shift(width)
        rows, end = self.slab.rows, self.local_end
        self.key_buffer[:rows, :, end:end + width] = key_states
        self.value_buffer[:rows, :, end:end + width] = value_states
        shown = slice(end - self.visible(), end + width)
        return self.key_buffer[:rows, :, shown], self.value_buffer[:rows, :, shown]

    def get_seq_length(self) -> int:
        return self.slab.length

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        shown = self.visible()
        return shown + query_length, self.slab.length - shown


class StateStore(LinearAttentionLayer):
    """One recurrent layer: each state (convolution window, recurrent state) as [row slots, ...]; the
    model reads and updates the batch's rows, slots [0, rows), in place."""

    def __init__(self, slab: SlabKV) -> None:  # not LinearAttentionLayer's: its states are views here
        self.slab = slab
        self.conv_pool: dict[int, torch.Tensor] = {}
        self.recurrent_pool: dict[int, torch.Tensor] = {}
        self.conv_kernel_size: dict[int, int] = {}
        self.record_past = False
        self.device = self.dtype = None

    # --- the slab's side -----------------------------------------------------
    def allocate(self, contents: RowState, slots: int, columns: int = 0) -> None:
        zeroed = self.slab.zeroed
        self.conv_pool = {i: _new(t, (slots, *t.shape[1:]), zeroed) for i, t in contents.conv.items() if t is not None}
        self.recurrent_pool = {i: _new(t, (slots, *t.shape[1:]), zeroed) for i, t in contents.recurrent.items()
                               if t is not None}
        self.conv_kernel_size = {i: t.shape[-1] for i, t in self.conv_pool.items()}
        first = next(iter(self.conv_pool.values()), None)
        if first is not None:
            self.device, self.dtype = first.device, first.dtype

    def reallocate(self, slots: int, left_room: int = 0, columns: int = 0) -> None:
        rows = self.slab.rows
        for pool in (self.conv_pool, self.recurrent_pool):
            for index, old in pool.items():
                if slots > old.shape[0]:
                    pool[index] = _new(old, (slots, *old.shape[1:]), self.slab.zeroed)
                    pool[index][:rows] = old[:rows]

    def place(self, row: int, contents: RowState, length: int) -> None:
        for index, pool in self.conv_pool.items():
            pool[row] = contents.conv[index][0]
        for index, pool in self.recurrent_pool.items():
            pool[row] = contents.recurrent[index][0]

    def move(self, hole: int, mover: int) -> None:
        for pool in (*self.conv_pool.values(), *self.recurrent_pool.values()):
            pool[hole] = pool[mover]

    def take(self, row: int, length: int, copy: bool = True) -> RowState:
        def slot(t: torch.Tensor) -> torch.Tensor:
            return t[row:row + 1].clone() if copy else t[row:row + 1]
        return RowState({i: slot(t) for i, t in self.conv_pool.items()}, {i: slot(t) for i, t in self.recurrent_pool.items()})

    def used_bytes(self) -> int:
        rows = self.slab.rows
        return sum(t[:rows].numel() * t.element_size() for t in (*self.conv_pool.values(), *self.recurrent_pool.values()))

    def advance(self) -> None:
        pass

    # --- the model's side (transformers' Cache reads these for get_conv_state / get_recurrent_state) ---
    @property
    def number_of_states(self) -> int:
        return max(len(self.conv_pool), len(self.recurrent_pool))

    @property
    def has_previous_state(self) -> dict[int, bool]:
        return {index: True for index in range(self.number_of_states)}

    def _batch(self) -> int:
        """The slots a step runs: its rows, or a static step's whole bucket."""
        return self.slab.rows if self.slab.bucket is None else self.slab.bucket

    @property
    def conv_states(self) -> dict[int, torch.Tensor]:
        return {index: pool[:self._batch()] for index, pool in self.conv_pool.items()}

    @property
    def recurrent_states(self) -> dict[int, torch.Tensor]:
        return {index: pool[:self._batch()] for index, pool in self.recurrent_pool.items()}

    @property
    def is_conv_states_initialized(self) -> dict[int, bool]:
        return {index: True for index in self.conv_pool}

    @property
    def is_recurrent_states_initialized(self) -> dict[int, bool]:
        return {index: True for index in self.recurrent_pool}

    def update_conv_state(self, conv_states: torch.Tensor, state_idx: int = 0, **kwargs) -> torch.Tensor:
        current = self.conv_pool[state_idx][:self._batch()]
        full = torch.cat([current, conv_states], dim=-1)
        current.copy_(full[..., -self.conv_kernel_size[state_idx]:])
        return full

    def update_recurrent_state(self, recurrent_states: torch.Tensor, state_idx: int = 0, **kwargs) -> torch.Tensor:
        current = self.recurrent_pool[state_idx][:self._batch()]
        current.copy_(recurrent_states)
        return current
