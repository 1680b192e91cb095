"""Failpoints in a real `serve` (INFERENCE_FAILPOINTS): engine, media and heartbeat faults are answered
within seconds in OpenAI's shape, logged, /health stays or says true, the next request succeeds, and the
ledger's token sums equal the usage the clients were told."""
from __future__ import annotations

import base64
import io
import sqlite3
import time

import httpx
import pytest

from .conftest import TINY_MODEL
from .live_server import LiveServer, base_env
from .helpers.ledger import complete, ledger_sums, load, wait_for_ledger

pytestmark = pytest.mark.timeout(300)
ANSWER_BOUND = 5.0


def error_codes(live: LiveServer) -> list[tuple[str]]:
    with sqlite3.connect(live.work_dir / "var" / "db.sqlite3") as db:
        return db.execute("select error_code from teams_usagerecord where status_code >= 500").fetchall()


def assert_engine_fault(response: httpx.Response, elapsed: float) -> None:
    assert response.status_code == 500, response.text
    error = response.json()["error"]
    assert error["type"] == "server_error" and error["code"] == "engine_fault", error
    assert elapsed < ANSWER_BOUND, f"the client waited {elapsed:.1f}s"


@pytest.fixture(scope="module")
def faulty(hf_cache, tmp_path_factory):
    work_dir = tmp_path_factory.mktemp("failpoints")
    env = base_env(hf_cache, work_dir, INFERENCE_HEARTBEAT_SECONDS="0.5",
                   INFERENCE_FAILPOINTS="engine.publish=raise*1,engine.loop=raise*1,worker.heartbeat=raise*2,"
                                        "media.read=raise*1")
    live = LiveServer(env, work_dir, name="failpoints")
    load(live)
    yield live
    live.stop()


def test_engine_faults_fail_the_request_fast_and_the_engine_goes_on(faulty):
    # One job meets the first busy loop turn's fault (engine.loop), the other the fault publishing its first
    # token (engine.publish, on the output thread): each fails fast, alone.
    for _ in range(2):
        response, elapsed = complete(faulty)
        assert_engine_fault(response, elapsed)
    for point in ("engine.publish", "engine.loop"):
        assert f"failpoint {point} fired" in faulty.log()
    assert "engine loop failed (1 in a row" in faulty.log()
    health = httpx.get(f"{faulty.base_url}/health", timeout=10)
    assert health.status_code == 200, health.text
    usages = []
    for _ in range(2):
        response, _ = complete(faulty)
        assert response.status_code == 200, response.text
        usages.append(response.json()["usage"])
    wait_for_ledger(faulty, (2, sum(u["prompt_tokens"] for u in usages), sum(u["completion_tokens"] for u in usages)))
    assert ledger_sums(faulty, status=500)[0] == 2  # the two faulted requests have their rows, as their clients saw them


def test_a_failed_heartbeat_is_logged_and_the_next_one_beats(faulty):
    deadline = time.monotonic() + 10
    while "the heartbeat of worker" not in faulty.log() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert "failpoint worker.heartbeat fired" in faulty.log()
    assert "the heartbeat of worker" in faulty.log()
    assert httpx.get(f"{faulty.base_url}/health", timeout=10).status_code == 200


def test_a_media_read_that_fails_for_any_reason_is_answered(faulty):
    from PIL import Image

    buffer = io.BytesIO()
    Image.new("RGB", (8, 8), "red").save(buffer, format="PNG")
    url = "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()
    started = time.monotonic()
    response = httpx.post(f"{faulty.base_url}/v1/chat/completions", headers=faulty.headers, timeout=120, json={
        "model": TINY_MODEL, "max_tokens": 2,
        "messages": [{"role": "user", "content": [{"type": "text", "text": "what is it?"},
                                                  {"type": "image_url", "image_url": {"url": url}}]}]})
    elapsed = time.monotonic() - started
    assert response.status_code == 500, response.text
    assert response.json()["error"]["code"] == "media_error"
    assert elapsed < ANSWER_BOUND
    assert "reading the media of" in faulty.log() and "FailpointError" in faulty.log()
    deadline = time.monotonic() + 10  # its ledger row says what its client was told
    while ("media_error",) not in error_codes(faulty) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert ("media_error",) in error_codes(faulty)
    response, _ = complete(faulty)
    assert response.status_code == 200, response.text


def test_a_dead_engine_is_restarted_once_then_the_server_says_why_and_exits(hf_cache, tmp_path):
    env = base_env(hf_cache, tmp_path, INFERENCE_FAILPOINTS="engine.loop=raise", INFERENCE_ENGINE_MAX_FAULTS="2",
                   INFERENCE_ENGINE_RESTARTS="1")
    live = LiveServer(env, tmp_path, name="dying")
    try:
        load(live)

        def kill_the_engine() -> None:
            response, elapsed = complete(live)
            assert_engine_fault(response, elapsed)
            response, elapsed = complete(live)
            assert response.status_code == 503, response.text
            assert response.json()["error"]["code"] == "engine_dead"
            assert elapsed < ANSWER_BOUND

        kill_the_engine()
        deadline = time.monotonic() + 30
        while "starting a fresh engine (restart 1 of 1" not in live.log():
            assert time.monotonic() < deadline and live.process.poll() is None, live.log()[-3000:]
            time.sleep(0.1)
        kill_the_engine()  # the fresh engine serves (and dies again: the failpoint still fires)
        deadline, reasons = time.monotonic() + 30, []
        while live.process.poll() is None and time.monotonic() < deadline:
            health = httpx.get(f"{live.base_url}/health", timeout=10)
            if health.status_code == 503:
                reasons = health.json()["reasons"]
                if "stopping" in reasons[0]:
                    break
            time.sleep(0.1)
        assert reasons and "embedded worker: stopping" in reasons[0] and "2 engine failures" in reasons[0], reasons
        live.process.wait(30)
        assert live.process.returncode != 0
        assert "the inference engine is dead: 2 loop failures in a row" in live.log()
        assert "The embedded worker stopped" in live.log()
    finally:
        live.stop()


def test_a_failure_publishing_one_request_stops_that_request_alone(hf_cache, tmp_path):
    """Each time publishing fails, one request ends with an engine_fault; its neighbours in the batch stream on."""
    import asyncio

    from openai import APIError, AsyncOpenAI

    env = base_env(hf_cache, tmp_path, INFERENCE_FAILPOINTS="engine.publish=raise%1")
    live = LiveServer(env, tmp_path, name="publish-faults")
    try:
        load(live)
        client = AsyncOpenAI(base_url=f"{live.base_url}/v1", api_key=live.key, max_retries=0, timeout=120)

        async def stream(index: int) -> str:
            try:
                async for chunk in await client.completions.create(
                        model=TINY_MODEL, prompt=f"Story {index}:", max_tokens=48, stream=True,
                        extra_body={"ignore_eos": True}):
                    if chunk.choices and chunk.choices[0].finish_reason:
                        return chunk.choices[0].finish_reason
            except APIError as error:
                return error.code or "error"
            return "cut"

        async def all_streams() -> list[str]:
            ends = await asyncio.gather(*[stream(i) for i in range(16)])
            await client.close()
            return ends

        ends = asyncio.run(all_streams())
        log = live.log()
        fired = log.count("ERROR protocol.failpoints [-]: failpoint engine.publish fired")
        assert fired >= 1, "no failure happened: the test saw nothing"  # 16 x 49 publishes at 1 %: ~8 expected
        assert sorted(set(ends)) <= ["engine_fault", "length"], ends
        assert ends.count("engine_fault") == fired  # one request per failure, none of its neighbours
        assert log.count("that request is stopped") == fired and "failing the running requests" not in log
        response, _ = complete(live)
        assert response.status_code == 200 or response.json()["error"]["code"] == "engine_fault"
    finally:
        live.stop()
