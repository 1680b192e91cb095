"""`python -m bench.structured`: what grammar-constrained rows cost the batch they share.

16 greedy streams at once against our server, in interleaved rounds: none constrained,
then half of them constrained by a grammar (`structured_outputs`). The grammar is a regex that
never completes and EOS is ignored, so every stream generates exactly `--max-tokens` tokens in
both workloads: the ratio of throughputs is the price of the masks (llguidance filling one
bitmask per step, applied to the constrained rows), nothing else. Writes bench/results/structured.{md,json}.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import tempfile
from pathlib import Path

from .load import bench_prompts, run_load
from .run import ROOT, ensure_model, positive_int
from .servers import OurServer

CONSTRAINT = {"structured_outputs": {"regex": "[a-z ,.]+"}, "ignore_eos": True}
STREAMS = 16


async def one_workload(base_url: str, model: str, max_tokens: int, constrained: int) -> dict:
    """STREAMS streams at once, the first `constrained` of them under the grammar."""
    prompts = bench_prompts(STREAMS)
    loads = [run_load(base_url, model, prompts[constrained:], STREAMS, max_tokens, {"ignore_eos": True})]
    if constrained:
        loads.append(run_load(base_url, model, prompts[:constrained], STREAMS, max_tokens, CONSTRAINT))
    results = await asyncio.gather(*loads)
    tokens = sum(result.tokens for result in results)
    errors = sum(result.errors for result in results)
    wall = max(result.wall_seconds for result in results)
    itls = [gap for result in results for r in result.results for gap in r.itls]
    return {"tokens": tokens, "errors": errors, "tokens_per_s": tokens / wall,
            "itl_p50_ms": 1000 * statistics.median(itls) if itls else None}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", default="local/small-llama")
    parser.add_argument("--size", default="small", choices=["tiny", "small"])
    parser.add_argument("--max-tokens", type=positive_int, default=64)
    parser.add_argument("--repeats", type=positive_int, default=3)
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    args = parser.parse_args()
    os.environ["HF_HUB_OFFLINE"] = "1"
    from huggingface_hub import constants

    cache = Path(os.environ.get("HF_HUB_CACHE") or constants.HF_HUB_CACHE)
    ensure_model(args.model, args.size, cache)
    server = OurServer(cache, Path(tempfile.mkdtemp(prefix="bench-structured-")))
    try:
        base_url = server.base_url
        for constrained in (0, STREAMS // 2):  # warm: model loaded, grammar compiled and cached
            asyncio.run(one_workload(base_url, args.model, 4, constrained))
        rounds = []
        for index in range(args.repeats):
            none = asyncio.run(one_workload(base_url, args.model, args.max_tokens, 0))
            half = asyncio.run(one_workload(base_url, args.model, args.max_tokens, STREAMS // 2))
            rounds.append({"none": none, "half": half, "ratio": half["tokens_per_s"] / none["tokens_per_s"]})
            print(f"round {index + 1}: none {none['tokens_per_s']:.1f} tok/s, half constrained "
                  f"{half['tokens_per_s']:.1f} tok/s, ratio {rounds[-1]['ratio']:.3f}")
    finally:
        server.stop()
    summary = {"model": args.model, "streams": STREAMS, "max_tokens": args.max_tokens, "constraint": CONSTRAINT,
               "rounds": rounds, "median_ratio": statistics.median(r["ratio"] for r in rounds)}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "structured.json").write_text(json.dumps(summary, indent=2))
    lines = ["| round | none constrained (tok/s) | half constrained (tok/s) | ratio |", "|---|---|---|---|"]
    lines += [f"| {i + 1} | {r['none']['tokens_per_s']:.1f} | {r['half']['tokens_per_s']:.1f} | {r['ratio']:.3f} |"
              for i, r in enumerate(rounds)]
    lines.append(f"\nMedian ratio (half constrained / none): **{summary['median_ratio']:.3f}**")
    (args.out / "structured.md").write_text("\n".join(lines) + "\n")
    print(f"median ratio {summary['median_ratio']:.3f}; wrote {args.out / 'structured.md'}")


if __name__ == "__main__":
    main()
