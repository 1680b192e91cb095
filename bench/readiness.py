"""`python -m bench.run --scenario readiness`: issue 49's "ready means ready" — a fresh process's first
completion after `/health` said ok, against its second, `--tries 5` times each for the embedded default
(`serve MODEL`, pinned) and scale-out (`serve --no-worker` + `run_worker` over a private redis-server).
The target: the first at most 0.5 s slower than the second. Report in `bench/results/readiness.json`: per
deployment, seconds from start to `/health` ok, first and second completion, first - second (median, max)."""
from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

from tests.helpers.readiness import first_and_second
from tests.live_server import LiveServer, ManagedProcess, base_env

from .models import ensure_model, prepare_cache

ROOT = Path(__file__).resolve().parent.parent
MODEL = "local/tiny-llama"
TARGET_SECONDS = 0.5


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="bench.run --scenario readiness", description=__doc__)
    parser.add_argument("--tries", type=int, default=5, help="fresh processes per deployment")
    parser.add_argument("--model", default=MODEL)
    parser.add_argument("--quick", action="store_true", help="1 try, embedded only")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    return parser.parse_args(argv)


def one_try(cache: Path, model: str, scale_out: bool) -> dict:
    """Start fresh processes, wait for `/health` ok, time two completions, stop."""
    with tempfile.TemporaryDirectory(prefix="bench-readiness-") as work:
        work_dir = Path(work)
        processes, redis = [], None
        started = time.monotonic()
        try:
            if scale_out:
                from tests.services import RedisServer

                (work_dir / "redis").mkdir()
                redis = RedisServer(work_dir / "redis")
                env = base_env(cache, work_dir, CHANNEL_LAYER_URL=redis.url, INFERENCE_MODEL=model)
                started = time.monotonic()
                web = LiveServer(env, work_dir, ("--no-worker", model), name="web")
                processes = [web, ManagedProcess(["manage.py", "run_worker"], env, work_dir / "worker.log")]
            else:
                web = LiveServer(base_env(cache, work_dir), work_dir, (model,))
                processes = [web]
            web.wait_healthy()
            ready = time.monotonic() - started
            first, second = first_and_second(web.base_url, web.headers, model)
            return {"ready_seconds": round(ready, 2), "first": round(first, 3), "second": round(second, 3),
                    "first_minus_second": round(first - second, 3)}
        finally:
            for process in processes:
                process.stop()
            if redis is not None:
                redis.stop()


def main(argv: list[str]) -> None:
    args = parse_args(argv)
    tries = 1 if args.quick else args.tries
    cache = prepare_cache()
    ensure_model(args.model, "tiny", cache)
    report = {"model": args.model, "target_seconds": TARGET_SECONDS, "deployments": {}}
    for name, scale_out in (("embedded", False), ("scale-out", True))[:1 if args.quick else 2]:
        runs = [one_try(cache, args.model, scale_out) for _ in range(tries)]
        gaps = [run["first_minus_second"] for run in runs]
        case = {"tries": tries, "ready_seconds_median": statistics.median(r["ready_seconds"] for r in runs),
                "first_median": statistics.median(r["first"] for r in runs),
                "second_median": statistics.median(r["second"] for r in runs),
                "first_minus_second_median": statistics.median(gaps), "first_minus_second_max": max(gaps),
                "within_target": sum(gap <= TARGET_SECONDS for gap in gaps), "runs": runs}
        report["deployments"][name] = case
        print(f"{name}: /health ok after {case['ready_seconds_median']:.1f}s; first completion "
              f"{case['first_median']:.3f}s vs second {case['second_median']:.3f}s (first - second: median "
              f"{case['first_minus_second_median']:.3f}s, max {case['first_minus_second_max']:.3f}s; "
              f"{case['within_target']}/{tries} within {TARGET_SECONDS}s)", flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "readiness.json").write_text(json.dumps(report, indent=2))
