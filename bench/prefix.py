"""`python -m bench.run --scenario prefix`: time to first token with a long shared prefix, a miss vs a hit.

Each round sends a prompt that starts with a new `--prefix-tokens` prefix (a
miss: the whole prompt is prefilled), then two more questions after the same
prefix. For attention models both are hits (only the question is prefilled). A
model with recurrent layers keeps its states only at checkpoints
(workers/engine/execution/kv/prefix_cache.py): the second prompt's prefill plants one
where its blocks part from the first's, and the third starts there. TTFT of all
three through the OpenAI SDK's streaming client; the ratio reported is the median
of per-round miss/third ratios (the second's TTFT is reported beside it).

`--families llama,mistral,gemma3,qwen3.5,jamba,mamba` runs each family's build
(workers/tiny/families.py, widened to hidden 512, as `local/family-<name>`: one per kind
of cache: full attention, sliding window, sliding + full, linear attention + full,
Mamba + full, Mamba) in one server instead of `--model`.
"""
from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

from .models import ensure_model, prepare_cache, prompt_ids
from .servers import OurServer

ROOT = Path(__file__).resolve().parent.parent
QUESTIONS = (" Question one: what happened next?", " Question two: who was there?", " Question three: when was it?")


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="bench.run --scenario prefix", description=__doc__)
    parser.add_argument("--model", default="local/small-llama")
    parser.add_argument("--size", default="small")
    parser.add_argument("--families", default="", help="comma-separated tiny families (workers/tiny/families.py) "
                                                        "to run instead of --model")
    parser.add_argument("--prefix-tokens", type=int, default=1500)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="tiny model, 400-token prefix, 2 rounds")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    args = parser.parse_args(argv)
    if args.quick:
        args.model, args.size, args.prefix_tokens, args.rounds = "local/tiny-llama", "tiny", 400, 2
    return args


def ttft(client, model: str, prompt: str) -> float:
    started = time.perf_counter()
    for chunk in client.completions.create(model=model, prompt=prompt, max_tokens=2, temperature=0, stream=True):
        if chunk.choices and chunk.choices[0].text:
            return time.perf_counter() - started
    return time.perf_counter() - started


def rounds_of(client, model: str, args) -> dict:
    """`args.rounds` rounds of a new prefix and three questions after it; the model's results."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model, local_files_only=True)
    stream = prompt_ids(model, args.prefix_tokens + 40 * args.rounds)[1:]
    ttft(client, model, "warm up")
    rounds = []
    for index in range(args.rounds):
        prefix = f"Round {index}. " + tokenizer.decode(stream[40 * index: 40 * index + args.prefix_tokens])
        miss, second, third = (ttft(client, model, prefix + question) for question in QUESTIONS)
        rounds.append({"miss_ms": round(miss * 1000, 1), "second_ms": round(second * 1000, 1),
                       "hit_ms": round(third * 1000, 1), "ratio": round(miss / third, 2),
                       "second_ratio": round(miss / second, 2)})
        print(f"{model} round {index + 1}/{args.rounds}: {rounds[-1]}", flush=True)
    return {"rounds": rounds, "miss_over_hit_median": statistics.median(r["ratio"] for r in rounds),
            "miss_over_second_median": statistics.median(r["second_ratio"] for r in rounds)}


# The families' builds widened (hidden 512: a 1,500-token prefill then costs ~10-30x the request's own path on
# 2 cores, as small-llama's does; the tiny builds' ~50 ms would measure HTTP more than reuse).
_WIDE = dict(hidden_size=512, intermediate_size=1536, num_attention_heads=8, num_key_value_heads=4, head_dim=64)
_NO_HEAD_DIM = {key: value for key, value in _WIDE.items() if key != "head_dim"}
WIDE: dict[str, dict] = {
    "llama": _WIDE, "mistral": _WIDE, "gemma3": {**_WIDE, "query_pre_attn_scalar": 64},
    "qwen3.5": {**_WIDE, "linear_key_head_dim": 64, "linear_value_head_dim": 64, "linear_num_key_heads": 4,
                "linear_num_value_heads": 8},
    "bamba": {**_NO_HEAD_DIM, "mamba_n_heads": 8, "mamba_d_head": 128, "mamba_d_state": 32},
    "jamba": {**_NO_HEAD_DIM, "mamba_d_state": 16},
    "mamba": {"hidden_size": 512, "state_size": 16},
}


def build_families(families: list[str], cache: Path) -> list[str]:
    """The families' builds, widened (WIDE), as `local/family-<name>` (the bench's tiny model keeps its name)."""
    from workers.tiny.builders import SIZES, train_tokenizer
    from workers.tiny.families import CONTEXT, build_tiny_family

    missing = [family for family in families if not (cache / f"models--local--family-{family}").is_dir()]
    if missing:
        print(f"building {', '.join(missing)} into {cache}")
        tokenizer = train_tokenizer(SIZES["tiny"]["vocab_target"], CONTEXT)
        for family in missing:
            build_tiny_family(family, repo_id=f"local/family-{family}", cache_dir=cache, tokenizer=tokenizer,
                              overrides=WIDE.get(family, _WIDE))
    return [f"local/family-{family}" for family in families]


def main(argv: list[str]) -> None:
    from openai import OpenAI

    args = parse_args(argv)
    cache = prepare_cache()
    families = [family for family in args.families.split(",") if family]
    if families:
        models = build_families(families, cache)
    else:
        ensure_model(args.model, args.size, cache)
        models = [args.model]
    server = OurServer(cache, Path(tempfile.mkdtemp(prefix="bench-prefix-")))
    try:
        client = OpenAI(base_url=server.base_url, api_key="bench", max_retries=0, timeout=600)
        per_model = {model: rounds_of(client, model, args) for model in models}
    finally:
        server.stop()
    results = {"scenario": "prefix", "prefix_tokens": args.prefix_tokens, "models": per_model}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "prefix.json").write_text(json.dumps(results, indent=2))
    for model, result in per_model.items():
        print(f"{model}: TTFT with a {args.prefix_tokens}-token shared prefix: a hit is "
              f"{result['miss_over_hit_median']} x faster than a miss (the second question: "
              f"{result['miss_over_second_median']} x; median of {len(result['rounds'])} rounds)")
