"""Word timestamps of a Whisper window (`timestamp_granularities[]=word`), from the model's own token timestamps.

`model.generate(..., return_token_timestamps=True)` aligns each generated token with the audio by
dynamic time warping over the cross-attention of the generation config's `alignment_heads`
(Whisper's own method). Tokens are grouped into words exactly as transformers' ASR pipeline does for
`return_timestamps="word"`: the tokenizer's word grouping (split at spaces and punctuation, or at
unicode boundaries for languages written without spaces), a token `i` spanning
`token_timestamps[i - 1]` to `token_timestamps[i]`, a word from its first token's start to its last
token's end. Plain Python + transformers: no Django.
"""
from __future__ import annotations

from protocol import Word


def has_alignment_heads(model) -> bool:
    return bool(getattr(model.generation_config, "alignment_heads", None))


def generate_with_token_timestamps(model, **kwargs) -> tuple[list[int], list[float]]:
    """One window: (token ids, token timestamps in seconds from the window's start), as generate returns them.

    generate switches the model to eager attention to read the cross-attention weights; the
    model's own implementation is restored afterwards so later requests run as before."""
    config = model.model.config
    attention = config._attn_implementation
    try:
        output = model.generate(**kwargs, return_token_timestamps=True)
    finally:
        config._attn_implementation = attention
    return output["sequences"][0].tolist(), output["token_timestamps"][0].tolist()


def words(tokenizer, ids: list[int], timestamps: list[float], language: str, offset: float) -> list[Word]:
    """The window's words with their start and end in seconds (`offset`: the window's start), in order.

    Special tokens (ids from the end of text on) are left out; words of only whitespace too."""
    from transformers.models.whisper.tokenization_whisper import _combine_tokens_into_words

    end_of_text = tokenizer.eos_token_id
    positions = [i for i, token in enumerate(ids) if token < end_of_text]
    texts, _, indices = _combine_tokens_into_words(tokenizer, [ids[i] for i in positions], language)
    found: list[Word] = []
    for text, members in zip(texts, indices):
        if not members or not text.strip():
            continue
        first, last = positions[members[0]], positions[members[-1]]
        start = timestamps[first - 1] if first > 0 else 0.0
        found.append({"word": text.strip(), "start": round(offset + float(start), 2),
                      "end": round(offset + float(timestamps[last]), 2)})
    return found

