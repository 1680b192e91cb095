"""YAML config files for `serve --config` and `client --config` (as forgather's), checked before use.

Keys may be written with dashes or underscores (`max-tokens` or `max_tokens`). An unknown key,
at any level, is an error that names it and lists the known ones; so is a value of the wrong
type. Command-line flags override the file: the commands merge with `merged_options`.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from django.core.management.base import CommandError

from protocol import MODEL_SAMPLING_KEYS, NEUTRAL_SAMPLING

NUMBER = (int, float)
# Sampling parameters both files may set (request fields; the client sends them, the server
# uses them as a model's defaults where the model config holds them): protocol's one list, an
# integer where its neutral value is one (top_k), else any number.
GENERATION_KEYS: dict[str, Any] = {
    key: int if isinstance(NEUTRAL_SAMPLING[key], int) else NUMBER for key in MODEL_SAMPLING_KEYS
}
MODEL_KEYS: dict[str, Any] = {
    "name": str, "preload": bool, "dtype": str, "device": str, "chat_template": str,
    "stop": list, "generation_defaults": GENERATION_KEYS, "idle_timeout": int, "aliases": list,
    "tool_parser": str, "reasoning_parser": str,
    "quantization": str, "trust_remote_code": bool, "attn_implementation": str, "gguf_file": str,
    "speculative_config": (str, dict), "tensor_parallel_size": int, "kv_cache_memory": (str, int),
}
SERVER_KEYS: dict[str, Any] = {
    "host": str, "port": int, "auth": bool, "device": str, "dtype": str, "chat_template": str,
    "chat_template_kwargs": dict, "reasoning": str, "model_timeout": NUMBER, "log_level": str,
    "model": str, "from_checkpoint": (bool, str), "trust_remote_code": bool, "quantization": str,
    "attn_implementation": str, "kv_cache_memory": (str, int), "gpu_memory_utilization": NUMBER,
    "enable_cors": bool, "cors_allow_origins": list, "auth_token_file": str, "default_seed": int, "stop_sequences": list, "ignore_eos": bool,
    "pass_message_extras": bool,
    "batching": {"max_num_seqs": int, "max_queue": int, "prefill_chunk": int, "prefill_share": NUMBER},
    "models": [MODEL_KEYS],
}
CLIENT_KEYS: dict[str, Any] = {
    "url": str, "model": str, "api_key": str, "auth_token_file": str, "system": str, "stream": bool, "echo": bool, "show_usage": bool,
    "max_tokens": int, "seed": int, "stop": list, "no_repeat_ngram_size": int, "min_length": int, "num_beams": int,
    "ignore_eos": bool, **GENERATION_KEYS,
}


def _type_name(expected) -> str:
    if isinstance(expected, dict):
        return "a mapping"
    if isinstance(expected, list):
        return "a list of mappings"
    if expected is NUMBER:
        return "a number"
    if isinstance(expected, tuple):
        return " or ".join(_type_name(one) for one in expected)
    return {int: "an integer", bool: "true or false", str: "a string", list: "a list", dict: "a mapping"}[expected]


def _check(value, expected, where: str):
    """The value with dashed keys normalised, or a CommandError naming `where`."""
    if isinstance(expected, dict):
        if not isinstance(value, dict):
            raise CommandError(f"{where}: expected {_type_name(expected)}.")
        checked = {}
        for key, item in value.items():
            name = str(key).replace("-", "_")
            path = f"{where}.{key}" if where else str(key)
            if name not in expected:
                raise CommandError(f"{path}: unknown key (known: {', '.join(sorted(expected))}).")
            checked[name] = _check(item, expected[name], path)
        return checked
    if isinstance(expected, list):
        if not isinstance(value, list):
            raise CommandError(f"{where}: expected {_type_name(expected)}.")
        return [_check(item, expected[0], f"{where}[{index}]") for index, item in enumerate(value)]
    wrong_bool = isinstance(value, bool) and bool not in (expected if isinstance(expected, tuple) else (expected,))
    if wrong_bool or not isinstance(value, expected):
        raise CommandError(f"{where}: expected {_type_name(expected)}, got {value!r}.")
    return value


def load_config(path: str, keys: dict[str, Any]) -> dict[str, Any]:
    """The file's settings, checked against `keys` (a nested spec of types)."""
    file = Path(path).expanduser()
    try:
        data = yaml.safe_load(file.read_text()) or {}
    except OSError as exc:
        raise CommandError(f"--config: cannot read {file}: {exc.strerror}") from exc
    except yaml.YAMLError as exc:
        raise CommandError(f"--config: {file} is not valid YAML: {exc}") from exc
    if not isinstance(data, dict):
        raise CommandError(f"--config: {file} must hold a mapping of settings.")
    checked = _check(data, keys, "")
    for index, model in enumerate(checked.get("models", [])):
        if "name" not in model:
            raise CommandError(f"models[{index}]: a model needs a name.")
    return checked


def merged_options(options: dict[str, Any], config: dict[str, Any], defaults: dict[str, Any]) -> dict[str, Any]:
    """Command line (where given) over the file over the defaults."""
    merged = dict(options)
    for key, default in defaults.items():
        if merged.get(key) is None:
            merged[key] = config.get(key, default)
    for key, value in config.items():
        if merged.get(key) is None:
            merged[key] = value
    return merged
