"""vLLM's `vllm serve` flags that a vLLM user's command line brings, under vLLM's names and meanings
(issue 49, item 3). Where we have the same option, vLLM's name is an alias of ours (argparse option
strings on the same argument); what is new to us is parsed here."""
import argparse
import json


def origins_list(text: str) -> list[str]:
    """vLLM's --allowed-origins: a JSON list of origins (default '["*"]' there), e.g. '["http://localhost:3000"]'."""
    try:
        origins = json.loads(text)
    except json.JSONDecodeError:
        origins = None
    if not isinstance(origins, list) or not all(isinstance(origin, str) for origin in origins):
        raise argparse.ArgumentTypeError(f"{text!r} is not a JSON list of origins, e.g. '[\"http://localhost:3000\"]'")
    return origins


def add_batching_flags(parser: argparse.ArgumentParser) -> None:
    """The engine's batch size under vLLM's name, on serve and run_worker alike."""
    parser.add_argument("--max-num-seqs", type=int, metavar="N",
                        help="vLLM's: at most N sequences in one batch (default: fit the device, 32 on CPU)")


def add_model_flags(parser: argparse.ArgumentParser) -> None:
    """vLLM's per-model flags: they apply to the pinned model (serve MODEL), written into its catalog row."""
    parser.add_argument("--served-model-name", nargs="+", metavar="NAME",
                        help="vLLM's: names clients may send as `model` for the pinned model (its catalog aliases)")
    parser.add_argument("--tool-call-parser", metavar="NAME",
                        help="vLLM's: the pinned model's tool parser (hermes, llama3_json, mistral…; default: what "
                             "its files say)")
    parser.add_argument("--reasoning-parser", metavar="NAME",
                        help="vLLM's: the pinned model's reasoning parser (qwen3, deepseek_r1…, none)")
    parser.add_argument("--enable-auto-tool-choice", action="store_true",
                        help="vLLM's: accepted; tool_choice \"auto\" is always on here")


def pinned_model_entry(options: dict) -> dict | None:
    """The pinned model's catalog settings from vLLM's per-model flags, as a config file's `models:` entry;
    None when none is given. Raises ValueError when they are given with no pinned model."""
    entry = {key: options[flag] for flag, key in (("served_model_name", "aliases"), ("tool_call_parser", "tool_parser"),
                                                  ("reasoning_parser", "reasoning_parser"))
             if options.get(flag)}
    if not entry:
        return None
    if not options.get("model"):
        raise ValueError("--served-model-name, --tool-call-parser and --reasoning-parser apply to the pinned model: "
                         "serve MODEL …")
    return {"name": options["model"], **entry}
