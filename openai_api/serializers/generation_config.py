"""`generation_config`: transformers serve's request field, a GenerationConfig as a JSON string (or object).

`transformers chat` sends one on every turn, and the seeds' tool-calling example sends it in
`extra_body`. Its keys become the request fields they mean (a field the request also sends wins, as
in transformers serve); keys that change nothing about the text (output flags, special-token ids a
tokenizer already has) are ignored; a key that would change the text and that this server cannot
honour is a 400 naming it, never silently dropped.
"""
from __future__ import annotations

import json
from typing import Any

from rest_framework import serializers

# GenerationConfig attribute -> the request field it sets.
HONOURED: dict[str, str] = {
    "temperature": "temperature", "top_p": "top_p", "top_k": "top_k", "min_p": "min_p", "typical_p": "typical_p",
    "repetition_penalty": "repetition_penalty", "no_repeat_ngram_size": "no_repeat_ngram_size",
    "min_length": "min_length", "min_new_tokens": "min_tokens", "num_beams": "num_beams",
    "length_penalty": "length_penalty", "early_stopping": "early_stopping", "bad_words_ids": "bad_words_ids",
    "do_sample": "do_sample", "max_new_tokens": "max_new_tokens", "num_return_sequences": "n",
    "stop_strings": "stop", "eos_token_id": "stop_token_ids",
}
# Keys that leave the generated text as it is: bookkeeping, what generate() returns, caching; and max_length
# (prompt + completion, which repos' generation_config.json carry: max_new_tokens and the context govern here).
IGNORED = frozenset({
    "transformers_version", "_from_model_config", "pad_token_id", "bos_token_id", "decoder_start_token_id",
    "use_cache", "cache_implementation", "cache_config", "return_legacy_cache", "output_attentions",
    "output_hidden_states", "output_scores", "output_logits", "return_dict_in_generate", "max_length",
    "remove_invalid_values", "renormalize_logits", "compile_config", "disable_compile",
})


def _parsed(value: Any) -> dict:
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError as exc:
            raise serializers.ValidationError({"generation_config": [f"Not valid JSON: {exc}."]}) from None
    if not isinstance(value, dict):
        raise serializers.ValidationError({"generation_config": ["Must be a JSON object (or a string holding one)."]})
    return value


def expand_generation_config(data: Any) -> Any:
    """The request body with `generation_config`'s keys as the fields they mean (the body's own fields win)."""
    if not isinstance(data, dict) or data.get("generation_config") is None:
        return data
    config = _parsed(data["generation_config"])
    unsupported = sorted(key for key, value in config.items()
                         if key not in HONOURED and key not in IGNORED and value not in (None, False, [], {}))
    if unsupported:
        raise serializers.ValidationError({"generation_config": [
            f"Not supported by this server: {', '.join(unsupported)} (honoured: {', '.join(sorted(HONOURED))})."]})
    fields: dict[str, Any] = {}
    for key, field in HONOURED.items():
        value = config.get(key)
        if value is None:
            continue
        if key == "eos_token_id" and isinstance(value, int):
            value = [value]
        fields[field] = value
    return {**fields, **{key: value for key, value in data.items() if key != "generation_config"}}
