"""`python -m bench.run --scenario abuse`: `serve` under an attacker, three phases on one server.

1. held sockets: `--sockets` (20,000) connections that send half a request and hold on (a header line
   every few seconds; closed, they connect again after a second) from `--attacker-addresses` loopback
   addresses (127.0.0.2, ...), spread over `--attacker-processes` processes (each has its own open-file
   limit), for `--seconds`. Meanwhile a normal client on 127.0.0.1 sends a short completion after each
   answer: its statuses and latency (p50, p95) against the same client's on the quiet server just before
   (this run's baseline), and the server's open descriptors against its limit.
2. overload: `--streams` (800) streamed completions at once (the server's default capacity: 32 running +
   256 queued on CPU): how many got 200 and 503, the slowest 503, and resets (none may be).
3. wrong keys: `--wrong-keys` (50) wrong bearer keys from one address, then its valid key.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import resource
import statistics
import tempfile
import threading
import time
from pathlib import Path

import httpx

from tests.live_server import LiveServer, base_env

from .models import ensure_model, prepare_cache
from .servers import ScaleOut

ROOT = Path(__file__).resolve().parent.parent
HALF_REQUEST = b"GET /health HTTP/1.1\r\nHost: x\r\n"


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="bench.run --scenario abuse", description=__doc__)
    parser.add_argument("--model", default="local/tiny-llama")
    parser.add_argument("--size", default="tiny", choices=["tiny", "small"])
    parser.add_argument("--sockets", type=int, default=20000)
    parser.add_argument("--attacker-addresses", type=int, default=20)
    parser.add_argument("--attacker-processes", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=30.0, help="how long the sockets are held")
    parser.add_argument("--streams", type=int, default=800)
    parser.add_argument("--stream-tokens", type=int, default=16)
    parser.add_argument("--wrong-keys", type=int, default=50)
    parser.add_argument("--max-num-seqs", type=int, default=0, help="the server's (0: its default)")
    parser.add_argument("--max-queue", type=int, default=0, help="the server's (0: its default)")
    parser.add_argument("--header-timeout", type=float, default=10.0, help="the server's INFERENCE_HEADER_TIMEOUT")
    parser.add_argument("--quick", action="store_true", help="a short run that checks it works")
    parser.add_argument("--scale-out", action="store_true",
                        help="against `serve --no-worker` with one `run_worker` over a private redis-server")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    args = parser.parse_args(argv)
    if args.quick:
        args.sockets, args.attacker_addresses, args.attacker_processes, args.seconds = 300, 3, 2, 2.0
        args.streams, args.max_num_seqs, args.max_queue, args.header_timeout = 60, 2, 4, 2.0
    return args


def raise_open_files() -> int:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return hard


# --- 1. held sockets ---------------------------------------------------------------------------
def attacker(port: int, addresses: list[str], sockets: int, seconds: float, held, opened) -> None:
    """One attacking process: `sockets` connections spread over `addresses`, each held as long as it lasts."""
    raise_open_files()

    async def hold(address: str, deadline: float) -> None:
        while time.monotonic() < deadline:
            try:
                reader, writer = await asyncio.open_connection("127.0.0.1", port, local_addr=(address, 0))
            except OSError:
                await asyncio.sleep(1.0)
                continue
            with opened.get_lock():
                opened.value += 1
            with held.get_lock():
                held.value += 1
            try:
                writer.write(HALF_REQUEST)
                while time.monotonic() < deadline:
                    try:
                        if not await asyncio.wait_for(reader.read(4096), timeout=3.0):
                            break  # closed by the server (a 408 came first, or nothing)
                    except TimeoutError:
                        writer.write(b"X-Slow: 1\r\n")  # one more header line: alive, never finished
            except OSError:
                pass
            finally:
                with held.get_lock():
                    held.value -= 1
                writer.close()
            await asyncio.sleep(1.0)

    async def main() -> None:
        deadline = time.monotonic() + seconds
        await asyncio.gather(*[hold(addresses[i % len(addresses)], deadline) for i in range(sockets)])

    asyncio.run(main())


def normal_client(base_url: str, key: str, model: str, seconds: float) -> dict:
    latencies, statuses = [], {}
    deadline = time.monotonic() + seconds
    with httpx.Client(timeout=30, headers={"Authorization": f"Bearer {key}"}) as http:
        while time.monotonic() < deadline:
            started = time.monotonic()
            try:
                status = http.post(f"{base_url}/v1/completions", json={"model": model, "prompt": "Hello",
                                                                       "max_tokens": 4}).status_code
            except httpx.HTTPError as exc:
                status = type(exc).__name__
            latencies.append(time.monotonic() - started)
            statuses[str(status)] = statuses.get(str(status), 0) + 1
            time.sleep(0.05)
    latencies.sort()
    return {"requests": len(latencies), "statuses": statuses, "p50_s": round(statistics.median(latencies), 3),
            "p95_s": round(latencies[int(len(latencies) * 0.95)], 3), "max_s": round(latencies[-1], 3)}


def held_sockets(server: LiveServer, model: str, args) -> dict:
    baseline = normal_client(server.base_url, server.key, model, min(5.0, args.seconds))
    addresses = [f"127.0.0.{2 + i}" for i in range(args.attacker_addresses)]
    held, opened = multiprocessing.Value("i", 0), multiprocessing.Value("i", 0)
    per_process = args.sockets // args.attacker_processes
    processes = [multiprocessing.Process(target=attacker, args=(
        server.port, addresses[i::args.attacker_processes] or addresses, per_process, args.seconds + 5, held, opened))
        for i in range(args.attacker_processes)]
    for process in processes:
        process.start()
    peak = {"held": 0, "descriptors": 0}
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            peak["held"] = max(peak["held"], held.value)
            peak["descriptors"] = max(peak["descriptors"], len(os.listdir(f"/proc/{server.process.pid}/fd")))
            stop.wait(0.5)

    sampling = threading.Thread(target=sample, daemon=True)
    sampling.start()
    time.sleep(min(5.0, args.seconds / 2))  # the attackers connect first
    under_attack = normal_client(server.base_url, server.key, model, args.seconds)
    stop.set()
    sampling.join()
    for process in processes:
        process.join(30)
        if process.is_alive():
            process.kill()
    limit = int(next(line.split()[3] for line in Path(f"/proc/{server.process.pid}/limits").read_text().splitlines()
                     if line.startswith("Max open files")))
    return {"sockets": args.sockets, "attacker_addresses": args.attacker_addresses, "seconds": args.seconds,
            "attacker_connections_opened": opened.value, "attacker_connections_held_peak": peak["held"],
            "server_descriptors_peak": peak["descriptors"], "server_open_file_limit": limit,
            "normal_baseline": baseline, "normal_under_attack": under_attack,
            "p95_under_attack_over_baseline": round(under_attack["p95_s"] / baseline["p95_s"], 2),
            "check_all_200_p95_under_1s": set(under_attack["statuses"]) == {"200"} and under_attack["p95_s"] < 1.0,
            "check_log_has_no_too_many_open_files": "Too many open files" not in server.log()}


# --- 2. overload ------------------------------------------------------------------------------
def overload(server: LiveServer, model: str, args) -> dict:
    """Raw sockets, not an HTTP library: with 800 connections at once httpx's own pool took seconds, which
    a client-side clock would have charged to the server."""
    async def one(index: int) -> tuple[str, float]:
        body = json.dumps({"model": model, "prompt": f"Story {index}:", "max_tokens": args.stream_tokens,
                           "ignore_eos": True, "stream": True}).encode()
        request = (f"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {server.key}\r\n"
                   f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n"
                   ).encode() + body
        started = time.monotonic()
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
            writer.write(request)
            status_line = await reader.readline()
            answered = time.monotonic() - started
            rest = await reader.read()
            writer.close()
        except OSError as exc:
            return f"reset ({type(exc).__name__})", time.monotonic() - started
        status = int(status_line.split()[1]) if status_line else 0
        if status == 200:
            return ("200" if b"data: [DONE]" in rest else "200 cut"), answered
        code = json.loads(rest.split(b"\r\n\r\n", 1)[1])["error"]["code"] if status else "no answer"
        return f"{status} {code}", answered

    async def everyone() -> list[tuple[str, float]]:
        return await asyncio.gather(*[one(i) for i in range(args.streams)])

    outcomes = asyncio.run(everyone())
    kinds: dict[str, int] = {}
    for kind, _ in outcomes:
        kinds[kind] = kinds.get(kind, 0) + 1
    refused = sorted(answered for kind, answered in outcomes if kind.startswith("503"))
    return {"streams": args.streams, "outcomes": kinds, "refused": len(refused),
            "slowest_503_s": round(refused[-1], 3) if refused else None,
            "median_503_s": round(statistics.median(refused), 3) if refused else None,
            "resets": sum(count for kind, count in kinds.items() if kind.startswith("reset")),
            "check_every_503_under_1s_no_resets": bool(refused) and refused[-1] < 1.0
            and not any(kind.startswith("reset") for kind in kinds)}


# --- 3. wrong keys ----------------------------------------------------------------------------
def wrong_keys(server: LiveServer, args) -> dict:
    statuses: dict[str, int] = {}
    with httpx.Client(timeout=30) as http:
        for index in range(args.wrong_keys + 5):
            status = http.get(f"{server.base_url}/v1/models",
                              headers={"Authorization": f"Bearer sk-wrong-{index}"}).status_code
            statuses[str(status)] = statuses.get(str(status), 0) + 1
        valid = http.get(f"{server.base_url}/v1/models", headers={"Authorization": f"Bearer {server.key}"}).status_code
    return {"wrong_keys": args.wrong_keys + 5, "wrong_key_statuses": statuses, "valid_key_after": valid,
            "check_valid_key_200": valid == 200}


def main(argv: list[str]) -> None:
    args = parse_args(argv)
    raise_open_files()
    cache = prepare_cache()
    ensure_model(args.model, args.size, cache)
    work = Path(tempfile.mkdtemp(prefix="bench-abuse-"))
    env = {key: str(value) for key, value in (("INFERENCE_MAX_NUM_SEQS", args.max_num_seqs),
                                              ("INFERENCE_MAX_QUEUE", args.max_queue),
                                              ("INFERENCE_HEADER_TIMEOUT", args.header_timeout)) if value}
    if args.scale_out:  # the same edge in front of a web process without a worker
        scale_out = ScaleOut(cache, work, workers=1, auth=True, INFERENCE_WORKER_ACK_TIMEOUT="120", **env)
        server = scale_out.web
    else:
        scale_out = None
        server = LiveServer(base_env(cache, work, INFERENCE_WORKER_ACK_TIMEOUT="120", **env), work, name="abuse")
    try:
        normal_client(server.base_url, server.key, args.model, 2.0)  # the engine starts, the model loads
        print("1. held sockets…", flush=True)
        report = {"held_sockets": held_sockets(server, args.model, args)}
        print(json.dumps(report["held_sockets"], indent=2), flush=True)
        time.sleep(args.header_timeout + 2)  # what is left of the attack times out
        print("2. overload…", flush=True)
        report["overload"] = overload(server, args.model, args)
        print(json.dumps(report["overload"], indent=2), flush=True)
        print("3. wrong keys…", flush=True)
        report["wrong_keys"] = wrong_keys(server, args)
    finally:
        (scale_out or server).stop()
    report["machine"] = f"{os.cpu_count()} CPUs"
    report["deployment"] = "scale-out (serve --no-worker + 1 run_worker)" if args.scale_out else "serve"
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / ("abuse-scale-out.json" if args.scale_out else "abuse.json")).write_text(json.dumps(report, indent=2))
    print(json.dumps(report, indent=2))
