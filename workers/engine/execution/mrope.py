"""M-RoPE (Qwen2-VL, Qwen2.5-VL, Qwen3-VL, Qwen3.5): three rotary positions per token, and an offset per row.

An image's tokens take (time, height, width) positions from its grid; the text after it goes on from the
largest, so every later token of that sequence sits at `index + offset` on all three axes, with an offset
of the prompt's own (`get_rope_index`'s delta; 0 for text alone). transformers keeps one `rope_deltas` on
the model, which a batch of other prompts overwrites; vLLM keeps the prompt's position table and delta per
request (`MRotaryEmbedding`). So does the engine: a sequence carries its prompt's table while it prefills
and its offset after, and the slab keeps each row's offset beside its length. The forward takes
(4, rows, tokens) positions: the plain index (for the mask), then the three rotary axes.
"""
from __future__ import annotations

import inspect

import torch


def takes_rope_offsets(model) -> bool:
    """Whether the model rotates by M-RoPE positions it works out itself from the prompt's media."""
    return callable(getattr(getattr(model, "model", None), "get_rope_index", None))


def prompt_rope_positions(model, prompt_ids: list[int], media_inputs: dict) -> tuple[torch.Tensor, int]:
    """(the prompt's (3, length) rotary positions, the offset of every token after it), from the model's own
    `get_rope_index` over the prompt and its media's grids."""
    index = model.model.get_rope_index
    accepted = inspect.signature(index).parameters
    device = next(model.parameters()).device
    kwargs = {key: value.to(device) for key, value in media_inputs.items() if key in accepted}
    positions, deltas = index(torch.tensor([prompt_ids], device=device), **kwargs)
    return positions[:, 0], int(deltas.reshape(-1)[0])


def prompt_position_ids(model, seq, positions: range) -> torch.Tensor:
    """A media prompt's prefill positions (4, 1, tokens) for prompt tokens `positions`; the first asks the model
    for the prompt's table and keeps it, and its offset, on the sequence."""
    if seq.rope_table is None:
        seq.rope_table, seq.rope_offset = prompt_rope_positions(model, seq.prompt_ids, seq.media_inputs)
    index = torch.arange(positions.start, positions.stop, device=seq.rope_table.device)[None]
    return rope_position_ids(index, seq.rope_table[:, None, positions.start:positions.stop])


def rope_position_ids(index: torch.Tensor, rotary: torch.Tensor) -> torch.Tensor:
    """The forward's (4, rows, tokens) positions from the plain index and the rotary positions (rows, tokens)
    or (3, rows, tokens)."""
    rotary = rotary.expand(3, *index.shape) if rotary.dim() == 2 else rotary
    return torch.cat([index[None], rotary])
