"""The GPU scenario's Markdown: one table a shape, every size any of the three ran at."""
from __future__ import annotations


def _cell(row: dict | None, key: str) -> str:
    if row is None:
        return "–"
    if row.get("error"):
        return "error"
    value = row.get(key)
    return "–" if value is None else str(value)


def markdown(report: dict) -> str:
    """Per shape: raw generate, generate_batch and ours side by side, then our TTFT, step, batch and busy %."""
    lines = [f"# GPU scenario: {report['device']} ({report.get('gpu') or 'no GPU'}), {report['dtype']}, "
             f"{report['max_tokens']} new tokens, greedy, EOS ignored, ~{report['prompt_len']}-token prompts", "",
             f"torch {report['torch']}, transformers {report['transformers']}; GPU busy % from "
             f"{report.get('busy_source') or 'nowhere (not sampled)'}; HBM bandwidth {report.get('hbm_gbps')} GB/s.", ""]
    for shape in report["shapes"]:
        lines += [f"## {shape['shape']} ({shape['model']}, {shape['params_m']}M params): HBM floor "
                  f"{shape['hbm_floor_ms']} ms per decode step", ""]
        if shape.get("server_error"):
            lines += [f"Our server failed: {shape['server_error']}", ""]
        raw = {r["size"]: r for r in shape.get("raw_generate", [])}
        batched = {r["size"]: r for r in shape.get("generate_batch", [])}
        ours = {r["concurrency"]: r for r in shape.get("ours", [])}
        lines += ["| c | ours tok/s | raw tok/s | generate_batch tok/s | ours/raw | ours/gb | TTFT p50 ms | TTFT p95 ms "
                  "| step ms | batch | step/floor | busy % ours | busy % raw | errors |",
                  "|" + "---|" * 14]
        for size in sorted({*raw, *batched, *ours}):
            mine = ours.get(size)
            lines.append(" | ".join([
                f"| {size}", _cell(mine, "tokens_per_s"), _cell(raw.get(size), "tokens_per_s"),
                _cell(batched.get(size), "tokens_per_s"), _cell(mine, "ours_raw"), _cell(mine, "ours_generate_batch"),
                _cell(mine, "ttft_p50_ms"), _cell(mine, "ttft_p95_ms"), _cell(mine, "step_ms_mean"),
                _cell(mine, "batch_mean"), _cell(mine, "step_over_hbm_floor"), _cell(mine, "gpu_busy_pct"),
                _cell(raw.get(size), "gpu_busy_pct"), _cell(mine, "errors")]) + " |")
        lines.append("")
    return "\n".join(lines)
