"""Prefix caching: a prompt that starts like an earlier one reuses that start's keys/values (and states).

Requests often share a prefix (a system prompt, the earlier turns of a chat,
few-shot examples, lm-eval's repeated contexts). After a prompt's prefill, its
keys/values are kept in blocks of `BLOCK_TOKENS` tokens, each block keyed by its
tokens and its parent block (so a block stands for the whole prefix up to its
end); a new prompt looks up its blocks in order and prefills only what follows
the longest run it finds. Entries are checked token for token, never trusted on a
hash alone. The blocks one prefill (or one finished row: its prompt and answer) adds
are kept as one *span*, one copy per layer, and evicted together, least recently used
first, to stay within the byte budget (a span's removal takes the spans and
checkpoints after it: no lookup could reach them). A lookup touches a run's spans from
its end back to its start, so a prefix's first blocks are the last to go. Output is
the same with or without a hit: the cached keys/values are those the same tokens at
the same positions produce.

Recurrent layers (Mamba, linear attention) keep one state per row, not one entry per
token, so a block cannot hold a piece of it: their prefixes are reused from
*checkpoints*, a copy of every recurrent state at one position (vLLM's "align" mode,
SGLang's MambaRadixCache), hung on the block run it ends (with the keys/values of the
at most `BLOCK_TOKENS - 1` tokens after that run, for a checkpoint between block
boundaries). The runner plants them at a prompt's end and a finished row's (a later
turn of the conversation starts there) and where a prompt parts from every cached one (the end of
a shared prefix, found by a lookup whose blocks run further than any checkpoint: that
prompt's prefill stops there once, one forward more, and later prompts with that
prefix start from it).
"""
from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

import torch
from transformers import DynamicCache

from workers.engine.execution.kv.rows import RowLayer, RowState, cache_from_layers, row_layers

BLOCK_TOKENS = 16


@dataclass
class Span:
    """The blocks one prefill (or one finished row) added, in one copy: a run of BLOCK_TOKENS-token blocks, each
    keyed by its tokens and the block before it, and every layer's keys/values of all of them (one copy per
    layer, not one per block: a row's answer is kept in a few copies, not thousands)."""
    parent: int | str | None  # key of the block before its first (the prompt's first block: its root)
    tokens: tuple[int, ...]  # BLOCK_TOKENS for each of `keys`
    keys: list[int]
    layers: list[RowLayer]  # per layer (keys, values) of its tokens, batch of 1 (None: a layer without them)
    size: int  # bytes
    used: int = 0  # when a lookup or a prefill last touched it (one clock for spans and checkpoints)

    def block_parent(self, index: int) -> int | str | None:
        return self.parent if index == 0 else self.keys[index - 1]

    def block_tokens(self, index: int) -> tuple[int, ...]:
        return self.tokens[index * BLOCK_TOKENS:(index + 1) * BLOCK_TOKENS]


@dataclass
class Checkpoint:
    """Every recurrent layer's state after a block run and `tail` tokens more (the tail's keys/values with it)."""
    parent: int | str | None  # key of the run's last block (a checkpoint follows one block at least)
    tail: tuple[int, ...]
    layers: list[RowLayer]  # per layer: the tail's (keys, values), the RowState, or None
    size: int
    used: int = 0


@dataclass
class PrefixHit:
    cache: DynamicCache | None  # the reused start's cache (None: nothing reused)
    tokens: int  # how many prompt tokens it holds
    shared: int = 0  # a recurrent model's prompt: where it parts from every cached prompt (≥ tokens)


class PrefixCache:
    def __init__(self, config, budget_bytes: int, checkpoints: bool = False) -> None:
        self.config = config
        self.budget = budget_bytes
        self.checkpoints_only = checkpoints  # the model keeps recurrent states: a hit must end at a checkpoint
        self.blocks: dict[int, tuple[Span, int]] = {}  # a block's key -> its span and its place in it
        self.spans: OrderedDict[int, Span] = OrderedDict()  # by their first block's key, least recently used first
        self.checkpoints: OrderedDict[tuple, Checkpoint] = OrderedDict()  # (parent, tail) -> checkpoint, LRU first
        self._at: dict[int | str | None, set[tuple[int, ...]]] = {}  # parent -> tails of its checkpoints
        self._children: dict[int | str | None, set[int]] = {}  # parent -> keys of the blocks after it
        self._clock = 0
        self.bytes = 0
        self.lookup_tokens = 0  # prompt tokens looked up
        self.hit_tokens = 0  # of those, found cached

    @staticmethod
    def _key(parent: int | str | None, tokens: tuple[int, ...]) -> int:
        return hash((parent, tokens))

    def _touch(self, entries: OrderedDict, key) -> None:
        entries.move_to_end(key)
        self._clock += 1
        entries[key].used = self._clock

    def _run(self, prompt_ids: list[int], blocks: int, root: str | None = None) -> list[int]:
        """Keys of the cached blocks that start the prompt, at most `blocks` of them."""
        keys: list[int] = []
        parent: int | str | None = root
        for index in range(blocks):
            tokens = tuple(prompt_ids[index * BLOCK_TOKENS:(index + 1) * BLOCK_TOKENS])
            key = self._key(parent, tokens)
            if not self._holds(key, parent, tokens):
                break
            keys.append(key)
            parent = key
        return keys

    def _holds(self, key: int, parent: int | str | None, tokens: tuple[int, ...]) -> bool:
        """Whether the cache holds this block (checked token for token, never on the hash alone)."""
        found = self.blocks.get(key)
        return found is not None and found[0].block_parent(found[1]) == parent and found[0].block_tokens(found[1]) == tokens

    def _checkpoint_after(self, prompt_ids: list[int], keys: list[int], limit: int,
                          may_end: Callable[[int], bool]) -> tuple[int, tuple] | None:
        """The longest checkpoint the prompt starts with, ending before its last token (`limit` tokens at most,
        and where `may_end` allows): (blocks of its run, its key)."""
        for blocks in range(len(keys), 0, -1):
            parent = keys[blocks - 1]
            base = blocks * BLOCK_TOKENS
            tails = [tail for tail in self._at.get(parent, ())
                     if base + len(tail) <= limit and tuple(prompt_ids[base:base + len(tail)]) == tail
                     and may_end(base + len(tail))]
            if tails:
                return blocks, (parent, max(tails, key=len))
        return None

    def _parting(self, prompt_ids: list[int], keys: list[int], root: str | None) -> int:
        """Where the prompt parts from every cached prompt: past its run of cached blocks, the most tokens of
        a block after that run it starts with."""
        base, parent = len(keys) * BLOCK_TOKENS, keys[-1] if keys else root
        ahead = prompt_ids[base:base + BLOCK_TOKENS]
        after = [span.block_tokens(index) for span, index in map(self.blocks.__getitem__, self._children.get(parent, ()))]
        after += list(self._at.get(parent, ()))
        return base + max((_alike(tokens, ahead) for tokens in after), default=0)

    def lookup(self, prompt_ids: list[int], root: str | None = None, may_end: Callable[[int], bool] | None = None,
               least: int = 0) -> PrefixHit:
        """A cache holding the longest cached start of the prompt (leaving at least its last token
        to prefill, whose logits are needed) and how many tokens it holds. `root` keys the entries
        by what else made them (a LoRA adapter's name, a prompt's pictures; None: the base model, text).
        `may_end(tokens)`: whether a start of that many tokens may be taken (none that cuts a picture).
        `least`: a recurrent model's hit is taken only where it leaves at most this many tokens to prefill
        (0: any; a model that continues its state one token at a time only prefills a short rest)."""
        may_end = may_end or (lambda tokens: True)
        usable = (len(prompt_ids) - 1) // BLOCK_TOKENS
        keys = self._run(prompt_ids, usable, root) if self.budget > 0 else []
        self.lookup_tokens += len(prompt_ids)
        if self.checkpoints_only:
            shared = self._parting(prompt_ids, self._run(prompt_ids, len(prompt_ids) // BLOCK_TOKENS, root), root)
            found = self._checkpoint_after(prompt_ids, keys, len(prompt_ids) - 1, may_end)
            if found is not None and least and len(prompt_ids) - found[0] * BLOCK_TOKENS - len(found[1][1]) > least:
                found = None
            if found is None:
                return PrefixHit(None, 0, shared)
            blocks, checkpoint_key = found
            keys = keys[:blocks]
            checkpoint = self.checkpoints[checkpoint_key]
            self._touch(self.checkpoints, checkpoint_key)
        else:
            while keys and not may_end(len(keys) * BLOCK_TOKENS):
                keys.pop()
            shared, checkpoint = len(keys) * BLOCK_TOKENS, None
        if not keys:
            return PrefixHit(None, 0, shared)
        pieces: list[tuple[Span, int, int]] = []  # runs of blocks in one span: (span, first block, end block)
        for key in keys:
            span, index = self.blocks[key]
            if pieces and pieces[-1][0] is span and pieces[-1][2] == index:
                pieces[-1] = (span, pieces[-1][1], index + 1)
            else:
                pieces.append((span, index, index + 1))
        for span, _, _ in reversed(pieces):
            self._touch(self.spans, span.keys[0])
        cached = len(keys) * BLOCK_TOKENS + (len(checkpoint.tail) if checkpoint else 0)
        self.hit_tokens += cached
        per_layer = zip(*([_columns(layer, first * BLOCK_TOKENS, end * BLOCK_TOKENS, copy=False)
                           for layer in span.layers] for span, first, end in pieces),
                        *([checkpoint.layers] if checkpoint else []))
        layers = [_joined(layer) for layer in per_layer]
        return PrefixHit(cache_from_layers(self.config, layers, cached), cached, shared)

    def remember(self, prompt_ids: list[int], cache: DynamicCache | list[RowLayer], root: str | None = None,
                 tokens: int | None = None) -> None:
        """Keep the full blocks of a sequence's first `tokens` tokens (default: all of `prompt_ids`), which
        `cache` holds exactly (a row's cache, or its layers' contents), and, for a recurrent model, a checkpoint
        of its states where they end. Blocks already kept are not copied again."""
        if self.budget <= 0:
            return
        tokens = len(prompt_ids) if tokens is None else tokens
        tensors = cache if isinstance(cache, list) else row_layers(cache)
        parent: int | str | None = root
        new: list[int] = []  # keys of the blocks not held yet: they go in one new span
        first = span_parent = None  # the first new block's index, and the key before it
        for index in range(tokens // BLOCK_TOKENS):
            block_tokens = tuple(prompt_ids[index * BLOCK_TOKENS:(index + 1) * BLOCK_TOKENS])
            key = self._key(parent, block_tokens)
            if not new and self._holds(key, parent, block_tokens):
                self._touch(self.spans, self.blocks[key][0].keys[0])
            else:
                if key in self.blocks:  # a block left past a dropped one, or a hash collision: the newer wins
                    self._drop(self.spans, self.blocks[key][0].keys[0])
                if not new:
                    first, span_parent = index, parent
                new.append(key)
            parent = key
        complete = True  # every block of the tokens is held (a checkpoint may hang on the last)
        if new:
            block_bytes = _size([_columns(layer, 0, BLOCK_TOKENS, copy=False) for layer in tensors], BLOCK_TOKENS)
            kept = new[:self.budget // block_bytes]  # never more than the whole budget holds
            complete, new = len(kept) == len(new), kept
        if new:
            begin, end = first * BLOCK_TOKENS, (first + len(new)) * BLOCK_TOKENS
            layers = [_columns(layer, begin, end) for layer in tensors]
            span = Span(span_parent, tuple(prompt_ids[begin:end]), new, layers, _size(layers, end - begin))
            for index, key in enumerate(new):
                self.blocks[key] = (span, index)
                self._children.setdefault(span.block_parent(index), set()).add(key)
            self.spans[new[0]] = span
            self.bytes += span.size
            self._touch(self.spans, new[0])
        if self.checkpoints_only and tokens >= BLOCK_TOKENS and complete:
            base = tokens // BLOCK_TOKENS * BLOCK_TOKENS
            tail = tuple(prompt_ids[base:tokens])
            if (parent, tail) not in self.checkpoints:
                layers = [RowState({i: t.clone() for i, t in layer.conv.items()},
                                   {i: t.clone() for i, t in layer.recurrent.items()})
                          if isinstance(layer, RowState) else _columns(layer, base, tokens) for layer in tensors]
                self.checkpoints[(parent, tail)] = Checkpoint(parent, tail, layers, _size(layers, len(tail)))
                self._at.setdefault(parent, set()).add(tail)
                self.bytes += self.checkpoints[(parent, tail)].size
            self._touch(self.checkpoints, (parent, tail))
        self._evict()

    def _drop(self, entries: OrderedDict, key) -> None:
        """One span or checkpoint out; a span takes with it what hangs on its blocks (spans after them and
        checkpoints: no lookup could reach them any more)."""
        entry = entries.pop(key, None)
        if entry is None:
            return
        self.bytes -= entry.size
        if isinstance(entry, Checkpoint):
            self._at[entry.parent].discard(entry.tail)
            if not self._at[entry.parent]:
                del self._at[entry.parent]
            return
        for index, block in enumerate(entry.keys):
            if self.blocks.get(block, (None,))[0] is entry:
                del self.blocks[block]
            siblings = self._children.get(entry.block_parent(index))
            if siblings is not None:
                siblings.discard(block)
                if not siblings:
                    del self._children[entry.block_parent(index)]
        for block in entry.keys:
            for child in list(self._children.get(block, ())):
                if child in self.blocks:
                    self._drop(self.spans, self.blocks[child][0].keys[0])
            for tail in list(self._at.get(block, ())):
                self._drop(self.checkpoints, (block, tail))

    def evict_to(self, limit: int) -> None:
        """Least recently used entries out until the cache holds at most `limit` bytes (rows need the room)."""
        self._evict(limit)

    def _evict(self, limit: int | None = None) -> None:
        """Least recently used entries out until the cache fits its budget (blocks and checkpoints alike)."""
        limit = self.budget if limit is None else limit
        while self.bytes > limit and (self.spans or self.checkpoints):
            entries = min((entries for entries in (self.spans, self.checkpoints) if entries),
                          key=lambda entries: next(iter(entries.values())).used)
            self._drop(entries, next(iter(entries)))

    def stats(self) -> dict:
        return {"prefix_cache_lookup_tokens": self.lookup_tokens, "prefix_cache_hit_tokens": self.hit_tokens,
                "prefix_cache_blocks": len(self.blocks), "prefix_cache_spans": len(self.spans),
                "prefix_cache_checkpoints": len(self.checkpoints),
                "prefix_cache_bytes": self.bytes}


def _alike(first, second) -> int:
    """How many tokens two sequences start with alike."""
    return next((i for i, (a, b) in enumerate(zip(first, second)) if a != b), min(len(first), len(second)))


def _columns(layer: RowLayer, begin: int, end: int, copy: bool = True) -> RowLayer:
    """An attention layer's keys/values of tokens [begin, end), copied (or views); None for other layers."""
    if layer is None or isinstance(layer, RowState):
        return None
    keys, values = layer[0][:, :, begin:end], layer[1][:, :, begin:end]
    return (keys.clone(), values.clone()) if copy else (keys, values)


def _joined(pieces: tuple[RowLayer, ...]) -> RowLayer:
    """One layer's pieces (blocks, then a checkpoint's) as one: keys/values concatenated, a state copied."""
    state = next((piece for piece in pieces if isinstance(piece, RowState)), None)
    if state is not None:
        return RowState({i: t.clone() for i, t in state.conv.items()}, {i: t.clone() for i, t in state.recurrent.items()})
    kv = [piece for piece in pieces if piece is not None]
    if not kv:
        return None
    return torch.cat([k for k, _ in kv], dim=-2), torch.cat([v for _, v in kv], dim=-2)


def _size(layers: list[RowLayer], tokens: int) -> int:
    """An entry's bytes: its tensors, and its tokens (a block of a model without keys/values still counts)."""
    size = 8 * tokens
    for layer in layers:
        tensors = (() if layer is None else (*layer.conv.values(), *layer.recurrent.values())
                   if isinstance(layer, RowState) else layer)
        size += sum(t.numel() * t.element_size() for t in tensors)
    return size
