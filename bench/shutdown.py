"""`python -m bench.run --scenario shutdown`: issue 49's drill — SIGINT and SIGTERM, `--tries 10` each, with
`--streams 16` streams in flight on a fresh `serve MODEL`; in each try the process must exit 0 and every stream
end with `[DONE]` (its tokens, or a `server_shutting_down` error event first). Half the tries use a grace long
enough to drain (every stream runs to its end), half a short one (every stream is ended by the server);
`--scale-out` signals a `run_worker` and then the `serve --no-worker` web over Redis instead. Report in
`bench/results/shutdown.json`: per case, tries, clean exits, streams ended well, seconds from signal to exit.
"""
from __future__ import annotations

import argparse
import json
import signal
import statistics
import tempfile
from pathlib import Path

from tests.live_server import LiveServer, ManagedProcess, base_env
from tests.shutdown_drill import signal_with_streams

from .models import ensure_model, prepare_cache

ROOT = Path(__file__).resolve().parent.parent
MODEL = "local/tiny-llama"


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="bench.run --scenario shutdown", description=__doc__)
    parser.add_argument("--tries", type=int, default=10, help="per signal")
    parser.add_argument("--streams", type=int, default=16)
    parser.add_argument("--scale-out", action="store_true", help="run_worker and serve --no-worker over Redis")
    parser.add_argument("--quick", action="store_true", help="2 tries per signal")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    return parser.parse_args(argv)


def one_try(cache: Path, signum: int, grace: str, streams: int, scale_out: bool) -> dict:
    with tempfile.TemporaryDirectory(prefix="bench-shutdown-") as work:
        work_dir = Path(work)
        extra = {"INFERENCE_SHUTDOWN_GRACE_SECONDS": grace}
        processes, redis = [], None
        try:
            if scale_out:
                from tests.services import RedisServer

                (work_dir / "redis").mkdir()
                redis = RedisServer(work_dir / "redis")
                env = base_env(cache, work_dir, CHANNEL_LAYER_URL=redis.url, **extra)
                web = LiveServer(env, work_dir, ("--no-worker",), name="web")
                worker = ManagedProcess(["manage.py", "run_worker"], env, work_dir / "worker.log")
                processes = [web, worker]
                target = worker if signum == signal.SIGTERM else web
            else:
                web = target = LiveServer(base_env(cache, work_dir, **extra), work_dir, (MODEL,))
                processes = [web]
            status, ends, took = signal_with_streams(target, web.base_url, web.headers, MODEL, signum, streams,
                                                     max_tokens=480)
            log = target.log()
            return {"exit": status, "ended_well": sum(end.ended_well for end in ends),
                    "errors": sum(bool(end.errors) for end in ends), "seconds": round(took, 2),
                    "aborted": "terminate called" in log}
        finally:
            for process in processes:
                process.stop()
            if redis is not None:
                redis.stop()


def main(argv: list[str]) -> None:
    args = parse_args(argv)
    tries = 2 if args.quick else args.tries
    cache = prepare_cache()
    ensure_model(MODEL, "tiny", cache)
    report = {"streams": args.streams, "scale_out": args.scale_out, "cases": {}}
    for name, signum in (("SIGINT", signal.SIGINT), ("SIGTERM", signal.SIGTERM)):
        results = [one_try(cache, signum, "30" if index % 2 == 0 else "0.3", args.streams, args.scale_out)
                   for index in range(tries)]
        case = {"tries": tries, "exit_0": sum(r["exit"] == 0 for r in results),
                "all_streams_ended_well": sum(r["ended_well"] == args.streams for r in results),
                "aborted": sum(r["aborted"] for r in results),
                "seconds_median": statistics.median(r["seconds"] for r in results), "runs": results}
        report["cases"][name] = case
        print(f"{name}: {case['exit_0']}/{tries} exit 0, {case['all_streams_ended_well']}/{tries} with every stream "
              f"ended well, {case['aborted']} aborted, {case['seconds_median']:.1f}s signal to exit (median)", flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "shutdown.json").write_text(json.dumps(report, indent=2))
