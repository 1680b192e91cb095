"""The benchmark's Markdown table and PNG plot."""
from __future__ import annotations

from pathlib import Path


def _ratio(value: float | None) -> str:
    return "–" if value is None else f"{value:.2f}"


def markdown(results: dict) -> str:
    raw = results["raw"]
    lines = [
        f"# Benchmark: {results['model']} ({results['params_m']}M params), {results['max_tokens']} new tokens, greedy, EOS ignored",
        "",
        f"Machine: {results['machine']}. Raw engine (`model.generate`, in-process): single sequence "
        f"{raw['single_tokens_per_s']} tok/s, padded batch of {raw['batch_size']} {raw['batch_tokens_per_s']} tok/s, "
        f"prefill of one prompt {raw['prefill_ms_p50']} ms (p50).",
        "",
        f"Raw, ours and the peer were measured in {results.get('repeats', 1)} interleaved rounds: each figure is the "
        "median over rounds (tokens/s of every round in the JSON), each ratio the median of the ratios within a round.",
        "",
        "| server | concurrency | requests | tokens/s | per round | TTFT p50 ms | TTFT p95 ms | ITL p50 ms | ITL p95 ms | errors | ours/raw | ours/peer |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    ratios = results.get("ratios", {})
    for name in ("ours", "peer", "scale_out"):
        for row in results.get(name, []):
            c = row["concurrency"]
            mine = ratios.get(str(c), {}) if name == "ours" else {}
            versus_raw, versus_peer = _ratio(mine.get("ours_raw")), _ratio(mine.get("ours_peer"))
            lines.append(
                f"| {name} | {c} | {row['requests']} | {row['tokens_per_s']} | {', '.join(map(str, row.get('runs_tokens_per_s', [])))} | "
                f"{row['ttft_p50_ms']} | {row['ttft_p95_ms']} | "
                f"{row['itl_p50_ms']} | {row['itl_p95_ms']} | {row['errors']} | {versus_raw} | {versus_peer} |"
            )
    memory = results.get("memory")
    if memory:
        lines += ["", f"Server memory (RSS): without a model {memory['idle_mb']} MB; with the model, after each of "
                      f"{len(memory['after_runs_mb'])} repeated runs: {memory['after_runs_mb']} MB "
                      f"(growth first→last {memory['growth_mb']} MB)."]
    ttft = results.get("ttft_overhead_ms")
    if ttft is not None:
        lines += ["", f"TTFT overhead at concurrency 1 over raw prefill (p50): {ttft} ms."]
    return "\n".join(lines) + "\n"


def plot(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (throughput, ttft) = plt.subplots(1, 2, figsize=(11, 4.2))
    raw = results["raw"]
    levels = sorted({row["concurrency"] for row in results["ours"]})
    # Raw has a figure for one sequence and for its padded batch (drawn at every level it fills).
    raw_levels = [c for c in levels if c == 1 or c >= raw["batch_size"]]
    raw_line = [raw["single_tokens_per_s"] if c == 1 else raw["batch_tokens_per_s"] for c in raw_levels]
    throughput.plot(raw_levels, raw_line, "k--", marker="s", label=f"raw model.generate (1 / padded batch of {raw['batch_size']})")
    for name, style in (("ours", "o-"), ("peer", "^-"), ("scale_out", "d:")):
        rows = results.get(name) or []
        if rows:
            label = {"ours": "ours (HTTP + channel layer + worker)", "peer": "transformers serve --continuous-batching",
                     "scale_out": "ours, 2 workers over Redis"}[name]
            throughput.plot([r["concurrency"] for r in rows], [r["tokens_per_s"] for r in rows], style, label=label)
            ttft.plot([r["concurrency"] for r in rows], [r["ttft_p50_ms"] or 0 for r in rows], style, label=label)
    throughput.set(xscale="log", xlabel="concurrent streams", ylabel="total tokens/s", title="Throughput")
    ttft.set(xscale="log", yscale="log", xlabel="concurrent streams", ylabel="TTFT p50 (ms)", title="Time to first token")
    for axis in (throughput, ttft):
        axis.set_xticks(levels, [str(c) for c in levels])
        axis.grid(alpha=0.3)
    throughput.legend(fontsize=7)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
