"""Prefix caching: a prompt that starts like an earlier one reuses that start's keys/values.

Requests often share a prefix (a system prompt, the earlier turns of a chat,
few-shot examples, lm-eval's repeated contexts). After a prompt's prefill, its
keys/values are kept in blocks of `BLOCK_TOKENS` tokens, each block keyed by its
tokens and its parent block (so a block stands for the whole prefix up to its
end); a new prompt looks up its blocks in order and prefills only what follows
the longest run it finds. Entries are checked token for token, never trusted on a
hash alone. Blocks are evicted least recently used first to stay within the byte
budget; a lookup touches a run from its end back to its start, so a prefix's
first blocks are the last to go. Output is the same with or without a hit: the
cached keys/values are those the same tokens at the same positions produce.
"""
from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

import torch
from transformers import DynamicCache

from workers.engine.execution.kv.rows import RowLayer, cache_from_layers, row_layers

BLOCK_TOKENS = 16


@dataclass
class Block:
    parent: int | str | None  # key of the block before it (the prompt's first block: its root, None for the base model)
    tokens: tuple[int, ...]
    layers: list[RowLayer]  # per layer (keys, values) of these tokens, batch of 1 (None: a layer without cache)
    size: int  # bytes


class PrefixCache:
    def __init__(self, config, budget_bytes: int) -> None:
        self.config = config
        self.budget = budget_bytes
        self.blocks: OrderedDict[int, Block] = OrderedDict()  # least recently used first
        self.bytes = 0
        self.lookup_tokens = 0  # prompt tokens looked up
        self.hit_tokens = 0  # of those, found cached

    @staticmethod
    def _key(parent: int | str | None, tokens: tuple[int, ...]) -> int:
        return hash((parent, tokens))

    def _run(self, prompt_ids: list[int], blocks: int, root: str | None = None) -> list[int]:
        """Keys of the cached blocks that start the prompt, at most `blocks` of them."""
        keys: list[int] = []
        parent: int | str | None = root
        for index in range(blocks):
            tokens = tuple(prompt_ids[index * BLOCK_TOKENS:(index + 1) * BLOCK_TOKENS])
            key = self._key(parent, tokens)
            block = self.blocks.get(key)
            if block is None or block.parent != parent or block.tokens != tokens:
                break
            keys.append(key)
            parent = key
        return keys

    def lookup(self, prompt_ids: list[int], root: str | None = None,
               may_end: Callable[[int], bool] | None = None) -> tuple[DynamicCache | None, int]:
        """A cache holding the longest cached start of the prompt (leaving at least its last token
        to prefill, whose logits are needed) and how many tokens it holds. `root` keys the entries
        by what else made them (a LoRA adapter's name, a prompt's pictures; None: the base model, text).
        `may_end(tokens)`: whether a start of that many tokens may be taken (none that cuts a picture)."""
        usable = (len(prompt_ids) - 1) // BLOCK_TOKENS
        keys = self._run(prompt_ids, usable, root) if self.budget > 0 else []
        while keys and may_end is not None and not may_end(len(keys) * BLOCK_TOKENS):
            keys.pop()
        self.lookup_tokens += len(prompt_ids)
        if not keys:
            return None, 0
        for key in reversed(keys):
            self.blocks.move_to_end(key)
        cached = len(keys) * BLOCK_TOKENS
        self.hit_tokens += cached
        per_layer = zip(*(self.blocks[key].layers for key in keys))
        layers = [None if layer[0] is None else (torch.cat([k for k, _ in layer], dim=-2), torch.cat([v for _, v in layer], dim=-2))
                  for layer in per_layer]
        return cache_from_layers(self.config, layers, cached), cached

    def remember(self, prompt_ids: list[int], cache: DynamicCache, root: str | None = None) -> None:
        """Keep the full blocks of a freshly prefilled prompt (its cache holds exactly the prompt)."""
        if self.budget <= 0:
            return
        tensors = row_layers(cache)
        parent: int | str | None = root
        for index in range(len(prompt_ids) // BLOCK_TOKENS):
            begin, end = index * BLOCK_TOKENS, (index + 1) * BLOCK_TOKENS
            tokens = tuple(prompt_ids[begin:end])
            key = self._key(parent, tokens)
            block = self.blocks.get(key)
            if block is not None and block.parent == parent and block.tokens == tokens:
                self.blocks.move_to_end(key)
            else:
                layers = [None if kv is None else (kv[0][:, :, begin:end].clone(), kv[1][:, :, begin:end].clone())
                          for kv in tensors]
                size = sum(k.numel() * k.element_size() + v.numel() * v.element_size() for k, v in filter(None, layers))
                if block is not None:  # a hash collision: the newer prefix takes the key
                    self.bytes -= block.size
                    del self.blocks[key]
                self.blocks[key] = Block(parent, tokens, layers, size)
                self.bytes += size
            parent = key
        while self.bytes > self.budget and self.blocks:
            _, evicted = self.blocks.popitem(last=False)
            self.bytes -= evicted.size

    def stats(self) -> dict:
        return {"prefix_cache_lookup_tokens": self.lookup_tokens, "prefix_cache_hit_tokens": self.hit_tokens,
                "prefix_cache_blocks": len(self.blocks), "prefix_cache_bytes": self.bytes}
