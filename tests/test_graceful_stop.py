"""SIGINT and SIGTERM with 16 streams in flight: the process exits 0 and every stream ends with `[DONE]`
(its tokens, or an OpenAI-shaped `server_shutting_down` error event first) — embedded `serve`, and
scale-out's `serve --no-worker` and `run_worker`. Once per case here; `bench/shutdown_drill.py` repeats
each case 10 times (issue 49's drill)."""
from __future__ import annotations

import re
import signal

import pytest

from .conftest import TINY_MODEL
from .live_server import LiveServer, ManagedProcess, base_env
from .shutdown_drill import signal_with_streams

FULL_SHUTDOWN = {"TESTS_FULL_SHUTDOWN": "1"}  # the whole interpreter shutdown, as a user's process has (tests/zygote.py)


def assert_clean_stop(status: int, ends, log: str, expect_error: bool) -> None:
    assert status == 0, log[-3000:]
    assert "terminate called" not in log
    assert all(end.ended_well for end in ends), [end.broken for end in ends]
    assert all(end.chunks > 0 for end in ends)
    if expect_error:  # past the grace: ended by the server, in OpenAI's shape (but streams done before it ended:
        # under -n 2 load the first streams run far ahead of the last one's first token, and finish in the grace)
        assert any(end.errors for end in ends), "the grace cut no stream short"
        assert all(end.before_signal or (end.errors and end.errors[-1]["code"] == "server_shutting_down")
                   or (end.done and not end.errors) for end in ends), [end.errors for end in ends]
    else:  # within the grace: every stream ran to its end
        assert not any(end.errors for end in ends), [end.errors for end in ends]


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
@pytest.mark.parametrize("grace", ["30", "0.3"], ids=["drained", "ended"])
def test_serve_stops_gracefully_with_streams_in_flight(hf_cache, tmp_path, signum, grace):
    server = LiveServer(base_env(hf_cache, tmp_path, INFERENCE_SHUTDOWN_GRACE_SECONDS=grace, **FULL_SHUTDOWN),
                        tmp_path, (TINY_MODEL,))
    try:
        status, ends, _ = signal_with_streams(server, server.base_url, server.headers, TINY_MODEL, signum,
                                              max_tokens=200 if grace == "30" else 480)
        assert_clean_stop(status, ends, server.log(), expect_error=grace != "30")
        in_flight = re.search(r"stopping: (\d+) generation requests in flight", server.log())
        assert in_flight and int(in_flight.group(1)) > 0  # the signal came with streams running
    finally:
        server.stop()


def test_scale_out_worker_and_web_stop_gracefully(hf_cache, tmp_path, redis_server):
    env = base_env(hf_cache, tmp_path, CHANNEL_LAYER_URL=redis_server.url, INFERENCE_SHUTDOWN_GRACE_SECONDS="0.3",
                   **FULL_SHUTDOWN)
    web = LiveServer(env, tmp_path, extra_args=("--no-worker",), name="web")
    workers = [ManagedProcess(["manage.py", "run_worker"], env, tmp_path / f"worker{i}.log") for i in range(2)]
    try:
        # SIGTERM to the worker running them: its streams end with the error event; the web goes on.
        status, ends, _ = signal_with_streams(workers[0], web.base_url, web.headers, TINY_MODEL, signal.SIGTERM,
                                              streams=16, max_tokens=480)
        # the other worker may have taken some: every stream still ends well, and the signalled worker exits 0
        assert status == 0, workers[0].log()[-3000:]
        assert "terminate called" not in workers[0].log()
        assert all(end.ended_well for end in ends), [end.broken for end in ends]
        # SIGINT to the web with the other worker's streams in flight: they end with the error event too.
        status, ends, _ = signal_with_streams(web, web.base_url, web.headers, TINY_MODEL, signal.SIGINT,
                                              streams=16, max_tokens=480)
        assert_clean_stop(status, ends, web.log(), expect_error=True)
    finally:
        for process in [web, *workers]:
            process.stop()
