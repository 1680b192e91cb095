"""A worker killed with -9 mid-stream, over a real Redis: its streams end within seconds with an
OpenAI-shaped error, its jobs that had produced nothing yet finish on the other worker, other
streams go on, and a job routed to the dead worker's channel is not lost."""
from __future__ import annotations

import json
import os
import signal
import time

import httpx
import pytest

from .conftest import TINY_MODEL
from .ledger_checks import row_of, sqlite_rows, wait_for_rows
from .live_server import LiveServer
from .services import RedisServer
from .helpers.catalog import catalog_cache, catalog_env, load_events, manage, wait_until  # noqa: F401
from .helpers.processes import Stream
from .helpers.processes import worker_processes

pytestmark = pytest.mark.scale_out
DETECTION_BOUND_SECONDS = 5.0


def error_of(stream: Stream) -> dict | None:
    payloads = [payload for _, payload in stream.events]
    if len(payloads) >= 2 and payloads[-1] == "[DONE]" and payloads[-2].startswith('{"error"'):
        return json.loads(payloads[-2])["error"]
    return None


def tokens_of(stream: Stream) -> int:
    """Chunks with text so far (a token whose text is held back makes none)."""
    return sum(1 for _, payload in stream.events if '"text"' in payload)


def token_ids_of(stream: Stream) -> int:
    """Token ids received (a stream asked with `return_token_ids`)."""
    return sum(len(choice.get("token_ids") or ()) for _, payload in stream.events if payload.startswith('{"id"')
               for choice in json.loads(payload)["choices"])


def usage_of(stream: Stream) -> dict | None:
    chunks = [json.loads(payload) for _, payload in stream.events if '"usage":{' in payload]
    return chunks[-1]["usage"] if chunks else None


def test_a_killed_worker_fails_fast_and_its_waiting_jobs_move(catalog_cache, tmp_path):  # noqa: F811
    redis = RedisServer(tmp_path)
    env = catalog_env(catalog_cache, tmp_path, CHANNEL_LAYER_URL=redis.url, INFERENCE_MAX_NUM_SEQS="4",
                      INFERENCE_WORKER_ACK_TIMEOUT="10")
    manage(env, "migrate", "--verbosity", "0")
    web = LiveServer(env, tmp_path, extra_args=("--no-worker",), name="web")
    # Each busy engine turn takes 15 ms more: the four 450-token streams last 7 s or longer, so they are still
    # running when the waiting ones are checked, however fast this machine is (they once ended first).
    workers = worker_processes({**env, "INFERENCE_FAILPOINTS": "engine.loop=delay(15)"}, tmp_path, 2)
    try:
        assert load_events(web, TINY_MODEL)[-1]["status"] == "ready"
        holder = next(w for w in workers if f"loaded {TINY_MODEL}@main on" in w.log())
        other = next(w for w in workers if w is not holder)
        time.sleep(2.0)  # both routing tables see the holder (heartbeats every 0.5 s)

        bystander = Stream(web, "local/other", max_tokens=150)  # goes to the worker with more free memory
        bystander.start()
        bystander.wait_for_tokens(3)
        running = [Stream(web, TINY_MODEL, max_tokens=450, return_token_ids=True) for _ in range(4)]  # the holder's 4 slots
        for stream in running:
            stream.start()
        wait_until(lambda: all(tokens_of(s) >= 3 for s in running), timeout=60, what="4 streams under way")
        waiting = [Stream(web, TINY_MODEL, max_tokens=40, stream_options={"include_usage": True}) for _ in range(3)]
        for stream in waiting:
            stream.start()
        wait_until(lambda: all(s.status == 200 for s in waiting), timeout=30, what="3 streams started, waiting")
        assert all(tokens_of(s) == 0 for s in waiting), [tokens_of(s) for s in waiting]
        assert all(s.is_alive() for s in running), [tokens_of(s) for s in running]

        os.kill(holder.process.pid, signal.SIGKILL)
        killed_at = time.monotonic()
        # A job for the dead worker's model right away: the survivor's table still routes it there.
        late = httpx.post(f"{web.base_url}/v1/completions", headers=web.headers, timeout=60,
                          json={"model": TINY_MODEL, "prompt": "Once upon a time", "max_tokens": 4})
        assert late.status_code == 200, late.text

        for stream in running:
            stream.join(DETECTION_BOUND_SECONDS + 10)
        detection = [stream.events[-1][0] - killed_at for stream in running]
        print(f"running streams ended {min(detection):.2f}-{max(detection):.2f}s after the kill")
        for stream in running:
            error = error_of(stream)
            assert error is not None and error["code"] == "worker_lost", stream.events[-2:]
            assert set(error) == {"message", "type", "param", "code"}
        assert max(detection) < DETECTION_BOUND_SECONDS

        for stream in [*waiting, bystander]:
            stream.join(120)
            assert not stream.is_alive() and error_of(stream) is None, stream.events[-2:]
            assert stream.events[-1][1] == "[DONE]"
        assert [usage_of(s)["completion_tokens"] for s in waiting] == [40] * 3
        assert other.log().count(f"loaded {TINY_MODEL}@main on") == 1  # the survivor took the moved jobs
        # The late job went to the survivor, which passed it to the dead holder, saw no confirmation and
        # ran it; or the dying worker's pending pop took it from Redis as it died, and the web sent it again.
        # The ledger: the cut streams as `worker_lost` with the tokens their clients got, the moved ones whole.
        rows = wait_for_rows(lambda: sqlite_rows(tmp_path), 9)
        assert len(rows) == 9, rows  # 4 cut, 3 moved, the bystander and the late one
        for stream in running:
            row = row_of(rows, json.loads(stream.events[0][1])["id"])
            assert (row["status_code"], row["error_code"]) == (503, "worker_lost"), row
            assert row["completion_tokens"] == token_ids_of(stream), (row, token_ids_of(stream))
        for stream in waiting:
            assert row_of(rows, json.loads(stream.events[0][1])["id"])["completion_tokens"] == 40
        late_id = late.json()["id"].split("~")[0]
        assert "did not confirm it" in other.log() or f"the worker of {late_id} went silent" in web.log(), \
            (other.log()[-3000:], web.log()[-3000:])
    finally:
        for worker in workers:
            worker.stop()
        web.stop()
        redis.stop()


def test_a_job_taken_by_a_worker_that_died_as_it_read_it_is_sent_again(catalog_cache, tmp_path):  # noqa: F811
    """A worker killed between Redis popping a job and its answer takes the job with it. Here a
    reader that pops one job and never answers stands for it; the web side sends the job again
    after WORKER_SILENCE_TIMEOUT and a live worker finishes it."""
    import redis as redis_client

    from inference_site.redis_layer import BatchingRedisChannelLayer

    redis = RedisServer(tmp_path)
    env = catalog_env(catalog_cache, tmp_path, CHANNEL_LAYER_URL=redis.url, INFERENCE_WORKER_ACK_TIMEOUT="20")
    manage(env, "migrate", "--verbosity", "0")
    web = LiveServer(env, tmp_path, extra_args=("--no-worker",), name="web")
    jobs_key = BatchingRedisChannelLayer(hosts=[redis.url]).prefix + "inference"
    workers = []
    try:
        request = Stream(web, TINY_MODEL, max_tokens=4)
        request.start()
        popped = redis_client.Redis.from_url(redis.url).bzpopmin(jobs_key, timeout=30)  # the job, gone
        assert popped is not None
        workers = worker_processes(env, tmp_path, 1)
        request.join(60)
        assert not request.is_alive() and request.status == 200, request.events[-2:]
        assert error_of(request) is None and tokens_of(request) >= 1
        assert "sending it again" in web.log()
    finally:
        for worker in workers:
            worker.stop()
        web.stop()
        redis.stop()
