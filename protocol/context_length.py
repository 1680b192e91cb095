"""A model's context length, read one way everywhere: `/v1/models`, the worker's limits, the pages.

Plain Python over the config.json dict (and the tokenizer's model_max_length): a vision- or audio-language
model keeps its length in `text_config`, which is read after the top level, never instead of it.
"""
from __future__ import annotations

LENGTH_KEYS = ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length")
DEFAULT_CONTEXT = 2048  # where neither the config nor the tokenizer names a length


def context_length(config: dict, tokenizer_max_length: object = None) -> int:
    """The first length the config names (top level, then text_config, then an omni model's thinker's text_config),
    else the tokenizer's, else DEFAULT_CONTEXT."""
    thinker = config.get("thinker_config") if isinstance(config.get("thinker_config"), dict) else {}
    for section in (config, config.get("text_config") or {}, thinker.get("text_config") or {}):
        if not isinstance(section, dict):
            continue
        for key in LENGTH_KEYS:
            value = section.get(key)
            if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                return value
    limit = tokenizer_max_length
    return limit if isinstance(limit, int) and not isinstance(limit, bool) and 0 < limit < 10**7 else DEFAULT_CONTEXT
