"""vLLM's `vllm serve` flags on `serve` and `run_worker`, with vLLM's meaning (issue 49): a vLLM user's command
line starts here unchanged. Where we had a flag of our own for the same thing, vLLM's name is an alias of it
(serve.py); this module adds the rest and turns them into settings, the pinned model's name and catalog rows."""
from __future__ import annotations

import argparse
import json
import re
from pathlib import Path
from typing import Any

from django.core.management.base import CommandError

from protocol.sizes import parse_bytes
from workers.engine.config import EngineConfig

# (option key, INFERENCE_* environment variable suffix) of the engine flags both `serve` and `run_worker` take.
ENGINE_FLAG_SETTINGS = (("max_model_len", "MAX_MODEL_LEN"), ("seed", "SEED"), ("max_num_seqs", "MAX_NUM_SEQS"),
                        ("generation_config", "GENERATION_CONFIG"), ("speculative_config", "SPECULATIVE_CONFIG"),
                        ("tensor_parallel_size", "TENSOR_PARALLEL_SIZE"), ("kv_cache_memory", "KV_CACHE_MEMORY"),
                        ("gpu_memory_utilization", "GPU_MEMORY_UTILIZATION"),
                        ("max_num_batched_tokens", "PREFILL_CHUNK"))
SIZE = re.compile(r"^(\d+(?:\.\d+)?)([kKmMgG]?)$")
SIZE_UNITS = {"": 1, "k": 1000, "K": 1024, "m": 1000**2, "M": 1024**2, "g": 1000**3, "G": 1024**3}


def context_size(text: str) -> int:
    """vLLM's --max-model-len: an integer, or with a suffix (1k = 1000, 1K = 1024, m/M, g/G); -1 and "auto"
    mean the model's own (0 here)."""
    if text in ("-1", "auto"):
        return 0
    match = SIZE.match(text.strip())
    if not match:
        raise argparse.ArgumentTypeError(f"{text!r} is not a length (e.g. 4096, 32k, 32K)")
    return int(float(match.group(1)) * SIZE_UNITS[match.group(2)])


def memory_size(text: str) -> int:
    """A size in bytes: 8589934592, 8G / 8GiB (1024-based), 8g / 8GB (1000-based)."""
    try:
        return parse_bytes(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def generation_config(text: str) -> str:
    """vLLM's --generation-config: "auto" (the model's generation_config.json), "vllm" (none of its sampling
    defaults), or a folder holding a generation_config.json."""
    if text in ("auto", "vllm"):
        return text
    folder = Path(text).expanduser()
    if not (folder / "generation_config.json").is_file():
        raise argparse.ArgumentTypeError(f"{text!r}: auto, vllm, or a folder with a generation_config.json")
    return str(folder.resolve())


def speculative_config(text: str) -> str:
    """vLLM's --speculative-config: its JSON, checked here (INFERENCE_SPECULATIVE_CONFIG takes it as given)."""
    from protocol.speculative import parse_speculative_config

    try:
        parse_speculative_config(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def memory_share(text: str) -> float:
    """vLLM's --gpu-memory-utilization: a share of the device's memory, over 0 to 1."""
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0.0 < value <= 1.0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a share of the device's memory over 0 to 1 (e.g. 0.9)")
    return value


def positive(text: str) -> int:
    """A whole number of at least 1."""
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of at least 1")
    return int(text)


def engine_flag_changes(options: dict[str, Any], prefix_cache_bytes: int) -> dict[str, str]:
    """The INFERENCE_* variables the engine flags given set (vLLM's flags override the environment);
    `prefix_cache_bytes`: the prefix cache's size as the environment says (--enable-prefix-caching turns a
    cache the environment turned off back on, at its default size)."""
    changes = {f"INFERENCE_{setting}": str(options[key]) for key, setting in ENGINE_FLAG_SETTINGS
               if options.get(key) is not None}
    if options.get("enable_prefix_caching") is False:
        changes["INFERENCE_PREFIX_CACHE_MB"] = "0"
    elif options.get("enable_prefix_caching") and not prefix_cache_bytes:  # back on, at its default size
        changes["INFERENCE_PREFIX_CACHE_MB"] = str(EngineConfig.prefix_cache_bytes // 2**20)
    return changes


def add_engine_flags(parser: argparse.ArgumentParser) -> None:
    """The flags that shape the engine: `serve` and `run_worker` alike (a scale-out worker runs the engine)."""
    group = parser.add_argument_group("vLLM's engine flags")
    group.add_argument("--max-model-len", type=context_size, metavar="N",
                       help="cap every model's context at N tokens (vLLM's; 32k and 32K forms too; default: each "
                            "model's own). A longer request is a 400 context_length_exceeded")
    group.add_argument("--seed", type=int, metavar="N",
                       help="seed the engine's random state at start (vLLM's): sampling without a request seed "
                            "repeats from run to run. Not --default-seed, which gives every request the same seed")
    group.add_argument("--max-num-seqs", type=int, metavar="N",
                       help="sequences decoded together in one batch (vLLM's; default: 256 on CUDA, 32 on CPU)")
    group.add_argument("--generation-config", type=generation_config, metavar="auto|vllm|FOLDER",
                       help="sampling defaults where a request sets none: auto (the model's generation_config.json, "
                            "default), vllm (none), or FOLDER/generation_config.json (vLLM's)")
    group.add_argument("--speculative-config", type=speculative_config, metavar="JSON",
                       help="speculative decoding, vLLM's JSON: '{\"method\": \"ngram\", \"num_speculative_tokens\": 5, "
                            "\"prompt_lookup_max\": 4, \"prompt_lookup_min\": 2}' (n-gram prompt lookup), or "
                            "'{\"method\": \"draft_model\", \"model\": \"NAME\", \"num_speculative_tokens\": 5}' (a "
                            "catalog model with the same tokenizer); full-attention models; default: off")
    group.add_argument("--kv-cache-memory", "--kv-cache-memory-bytes", type=memory_size, metavar="BYTES",
                       help="each model's KV cache budget (vLLM's --kv-cache-memory-bytes): 8G, 8GiB, 8589934592; "
                            "requests wait for room, rows are preempted and recomputed when decode outgrows it, and a "
                            "model's context is capped to what it holds. A model's own kv_cache_memory (admin, config "
                            "file) wins. Default: 80%% of the GPU's free memory after the model loads, 50%% of the "
                            "machine's available memory on the CPU")
    group.add_argument("--gpu-memory-utilization", type=memory_share, metavar="SHARE",
                       help="vLLM's: the share of the device's whole memory (0 to 1, e.g. 0.9) the server may use, "
                            "weights and everything else in use included; each model's KV cache budget is what "
                            "is left of it once the model has loaded (on a CPU, a share of the machine's memory). "
                            "--kv-cache-memory wins where both are given")
    group.add_argument("--max-num-batched-tokens", type=positive, metavar="N",
                       help="the most prompt tokens one engine step prefills (vLLM's; here INFERENCE_PREFILL_CHUNK: "
                            "longer prompts go in chunks of it; the decode rows come on top). Default: 8192 on "
                            "CUDA, 512 on CPU")
    group.add_argument("--enable-prefix-caching", action=argparse.BooleanOptionalAction, default=None,
                       help="reuse the keys/values (or recurrent states) of earlier prompts and answers for prompts "
                            "that start the same way (vLLM's; on by default, INFERENCE_PREFIX_CACHE_MB; "
                            "--no-enable-prefix-caching turns it off)")
    group.add_argument("--tensor-parallel-size", "-tp", type=positive, metavar="N",
                       help="split each model over N devices (vLLM's): N GPUs over NCCL, or N CPU processes over "
                            "gloo; the model needs transformers' tensor-parallel plan and heads that divide by N. "
                            "A model's own tensor_parallel_size in the admin or config file wins; default: 1")


def add_server_flags(parser: argparse.ArgumentParser) -> None:
    """The flags about the served model that `serve` alone takes (it names the pinned model)."""
    group = parser.add_argument_group("vLLM's model flags (about the pinned MODEL)")
    group.add_argument("--served-model-name", nargs="+", metavar="NAME",
                       help="names clients may send as `model` for the pinned model (vLLM's; here aliases: the repo "
                            "id keeps working)")
    group.add_argument("--revision", metavar="REV",
                       help="the pinned model's branch, tag or commit (vLLM's; the same as MODEL@REV)")
    group.add_argument("--tokenizer", metavar="NAME",
                       help="vLLM's: accepted when it is the model's own tokenizer (a separate one is refused)")
    group.add_argument("--tool-call-parser", metavar="NAME",
                       help="the pinned model's tool-call parser (vLLM's names: hermes, llama3_json, mistral, "
                            "qwen3_coder, deepseek_v3…; default: the one its files point to)")
    group.add_argument("--reasoning-parser", metavar="NAME",
                       help="the pinned model's reasoning parser (vLLM's names: qwen3, deepseek_r1, mistral, "
                            "granite…, or none)")
    group.add_argument("--enable-auto-tool-choice", action="store_true",
                       help="vLLM's; always on here (tool_choice auto works for every model)")


def allowed_origins(values: list[str] | None) -> list[str]:
    """--cors-allow-origins takes origins as words; vLLM's --allowed-origins as a JSON list ('["*"]')."""
    origins: list[str] = []
    for value in values or []:
        if value.strip().startswith("["):
            try:
                parsed = json.loads(value)
            except ValueError as exc:
                raise CommandError(f"--allowed-origins: not a JSON list: {exc}") from None
            if not isinstance(parsed, list) or not all(isinstance(item, str) for item in parsed):
                raise CommandError("--allowed-origins: a JSON list of origins, e.g. '[\"http://localhost:3000\"]'")
            origins.extend(parsed)
        else:
            origins.append(value)
    return origins


def pinned_name(name: str | None, revision: str | None, tokenizer: str | None) -> str | None:
    """MODEL with vLLM's --revision applied; --tokenizer checked to name the model itself."""
    if revision:
        if not name:
            raise CommandError("--revision applies to the pinned model: serve MODEL --revision REV")
        if "@" in name:
            raise CommandError(f"MODEL {name} names a revision already; drop --revision or the @")
        name = f"{name}@{revision}"
    if tokenizer and tokenizer.rstrip("/") != (name or "").split("@")[0].rstrip("/"):
        raise CommandError(f"--tokenizer {tokenizer}: a tokenizer other than the model's own is not supported "
                           "(the worker loads each model's tokenizer from its repo); leave it out")
    return name


def pinned_model_entry(model: str, options: dict[str, Any]) -> dict | None:
    """The catalog settings vLLM's model flags give the pinned model, as a config file's `models:` entry."""
    entry: dict[str, Any] = {}
    if options.get("served_model_name"):
        entry["aliases"] = [name for name in options["served_model_name"] if name != model]
    for key in ("tool_call_parser", "reasoning_parser"):
        if options.get(key):
            entry["tool_parser" if key == "tool_call_parser" else key] = options[key]
    if not entry:
        return None
    if not model:
        flags = ", ".join(f"--{key.replace('_', '-')}" for key in ("served_model_name", "tool_call_parser",
                                                                    "reasoning_parser") if options.get(key))
        raise CommandError(f"{flags}: about the pinned model; serve MODEL {flags.split(',')[0]} … (other models: "
                           "the catalog admin, or a config file's models:)")
    return {"name": model.split("@")[0], **entry}
