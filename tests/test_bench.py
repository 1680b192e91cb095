"""The benchmark tool itself keeps working (a quick run on the tiny model; no speed asserted here)."""
from __future__ import annotations

import json
import subprocess
import sys

from .live_server import ROOT


def test_bench_runs_and_writes_its_report(hf_cache, tmp_path):
    out = tmp_path / "results"
    env = {"HF_HUB_CACHE": str(hf_cache), "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    subprocess.run(
        [sys.executable, "-m", "bench.run", "--model", "local/tiny-llama", "--size", "tiny", "--concurrency", "1,4",
         "--max-tokens", "8", "--repeats", "2", "--memory-runs", "2", "--skip-peer", "--out", str(out)],
        cwd=ROOT, env=env, check=True, capture_output=True, timeout=600,
    )
    results = json.loads((out / "results.json").read_text())
    assert [row["concurrency"] for row in results["ours"]] == [1, 4]
    assert all(row["errors"] == 0 and row["tokens"] == 8 * max(row["concurrency"], 2) for row in results["ours"])
    assert all(len(row["runs_tokens_per_s"]) == 2 for row in results["ours"])  # two interleaved rounds
    assert results["ratios"]["1"]["ours_raw"] > 0 and results["ratios"]["1"]["ours_peer"] is None
    assert len(results["raw"]["batch_runs"]) == 2
    assert results["raw"]["batch_tokens_per_s"] > 0
    assert len(results["memory"]["after_runs_mb"]) == 2
    assert "| ours | 4 |" in (out / "results.md").read_text()
    assert (out / "plot.png").stat().st_size > 1000
