"""Speculative decoding's settings, in vLLM's JSON (`serve --speculative-config '{"method": "ngram", ...}'`).

Plain Python, read by the settings (INFERENCE_SPECULATIVE_CONFIG, `serve --speculative-config`), the catalog's
per-model field (checked there, taken by the worker) and the engine (workers/engine/speculation/). Off unless
set. vLLM's key names are kept so a vLLM command line works unchanged.
"""
from __future__ import annotations

import json
from dataclasses import dataclass

METHODS = ("ngram", "draft_model")  # vLLM's also: eagle, eagle3, mtp, medusa (not served here)
KEYS = ("method", "model", "num_speculative_tokens", "prompt_lookup_min", "prompt_lookup_max")
NUMBERS = ("num_speculative_tokens", "prompt_lookup_min", "prompt_lookup_max")


@dataclass(frozen=True)
class SpeculativeConfig:
    """N-gram prompt lookup (`ngram`): propose up to `num_speculative_tokens` tokens that followed the longest
    earlier occurrence (of `prompt_lookup_min`..`prompt_lookup_max` tokens) of a row's last tokens; or a draft
    model (`draft_model`): the catalog model `model` (same tokenizer) proposes them greedily."""

    method: str = "ngram"
    num_speculative_tokens: int = 5
    prompt_lookup_min: int = 2
    prompt_lookup_max: int = 4
    model: str = ""  # draft_model: the draft's catalog name (repo[@revision])

    def describe(self) -> str:
        if self.method == "draft_model":
            return f"draft model {self.model}, {self.num_speculative_tokens} tokens"
        return (f"{self.method}, {self.num_speculative_tokens} tokens, n-grams of "
                f"{self.prompt_lookup_min}-{self.prompt_lookup_max}")


OFF = "off"  # a model's own value that turns speculation off where the server turns it on


def model_speculative_config(own: str, server: SpeculativeConfig | None) -> SpeculativeConfig | None:
    """A model's catalog value over the server's: "" the server's, "off" none, else its own JSON."""
    if not own or not own.strip():
        return server
    if own.strip().lower() == OFF:
        return None
    return parse_speculative_config(own)


def parse_speculative_config(text: str | dict | None) -> SpeculativeConfig | None:
    """vLLM's JSON (or its dict) as a SpeculativeConfig; None for "" or null (off). A ValueError names what is wrong."""
    if text is None or (isinstance(text, str) and not text.strip()):
        return None
    if isinstance(text, str):
        try:
            value = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValueError(f"speculative config is not JSON: {exc}") from None
    else:
        value = text
    if value is None:
        return None
    if not isinstance(value, dict):
        raise ValueError("speculative config must be a JSON object, e.g. "
                         '{"method": "ngram", "num_speculative_tokens": 5, "prompt_lookup_max": 4}')
    unknown = sorted(set(value) - set(KEYS))
    if unknown:
        raise ValueError(f"speculative config: unknown keys {unknown} (known: {', '.join(KEYS)})")
    method = value.get("method", "ngram")
    if method not in METHODS:
        raise ValueError(f"speculative config: method {method!r} is not served (served: {', '.join(METHODS)})")
    model = value.get("model", "")
    if method == "draft_model" and (not isinstance(model, str) or not model.strip()):
        raise ValueError('speculative config: draft_model needs "model", the draft\'s catalog name')
    numbers = {}
    for key in NUMBERS:
        if key in value:
            if not isinstance(value[key], int) or isinstance(value[key], bool) or value[key] < 1:
                raise ValueError(f"speculative config: {key} must be a positive integer, not {value[key]!r}")
            numbers[key] = value[key]
    if "num_speculative_tokens" not in numbers:
        raise ValueError("speculative config: num_speculative_tokens is required (vLLM's too)")
    # vLLM's rule: a bound given alone sets the other too; neither gives 2..4 here
    low = numbers.get("prompt_lookup_min", numbers.get("prompt_lookup_max", 2))
    high = numbers.get("prompt_lookup_max", numbers.get("prompt_lookup_min", 4))
    if low > high:
        raise ValueError(f"speculative config: prompt_lookup_min ({low}) is above prompt_lookup_max ({high})")
    return SpeculativeConfig(method, numbers["num_speculative_tokens"], low, high,
                             model.strip() if method == "draft_model" else "")
