"""A prompt with pictures: its processor tensors for one prefill, and its place in the prefix cache.

Equal placeholder ids stand for different pictures, so a media prompt's cached keys/values are keyed by a
digest of its pictures' tensors as well as by its tokens. A start taken from the cache never cuts the
pictures' tokens: it ends before the first one (the rest's forward takes every picture) or after the last
(the rest is text, and takes none) — a second turn about the same picture reuses the whole first turn.
Only models whose positions the engine passes itself (M-RoPE, workers/engine/execution/mrope.py) reuse
them: the others work out positions or masks from the whole prompt's tensors.
"""
from __future__ import annotations

import hashlib
from collections.abc import Callable

import torch

PER_TOKEN = ("mm_token_type_ids", "token_type_ids")  # one value per prompt token: sliced with the tokens


def media_span(media_inputs: dict) -> tuple[int, int] | None:
    """(first, last) index of the prompt's media tokens, from the processor's token types (None: not told)."""
    types = media_inputs.get("mm_token_type_ids")
    if types is None:
        return None
    where = types[0].nonzero()
    return (int(where[0]), int(where[-1])) if len(where) else None


def may_end_at(media_inputs: dict) -> Callable[[int], bool]:
    """Whether a cached start of n tokens leaves the prompt's pictures whole (before them all, or after)."""
    span = media_span(media_inputs)
    if span is None:
        return lambda tokens: False
    first, last = span
    return lambda tokens: tokens <= first or tokens > last


def media_digest(media_inputs: dict) -> str:
    """What the prompt's pictures are, as bytes: equal digests, equal pictures at equal sizes."""
    digest = hashlib.sha256()
    for key in sorted(media_inputs):
        if key not in PER_TOKEN:
            value = media_inputs[key].detach().cpu().contiguous()
            digest.update(f"{key}:{value.dtype}:{tuple(value.shape)}".encode())
            digest.update(value.view(torch.uint8).numpy().tobytes() if value.numel() else b"")
    return digest.hexdigest()


def prefix_root(seq) -> str | None:
    """What besides its tokens made a prompt's keys/values in the prefix cache: the LoRA adapter, the pictures."""
    adapter = getattr(seq.request.model, "adapter", None)
    if seq.media_inputs is None:
        return adapter
    return f"{adapter or ''}|{media_digest(seq.media_inputs)}"


def chunk_media(media_inputs: dict, start: int, stop: int) -> dict:
    """The tensors a forward over prompt tokens [start, stop) takes: per-token ones sliced; the pictures' only
    if their tokens are still to come (a start from the cache may hold them all)."""
    span = media_span(media_inputs)
    after = span is not None and start > span[1]
    return {key: value[:, start:stop] if key in PER_TOKEN else value
            for key, value in media_inputs.items() if key in PER_TOKEN or not after}
