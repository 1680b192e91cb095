"""The known faults of issue 25 over a real Redis: a deadline that compares no clocks."""
from __future__ import annotations

import time

import httpx
import pytest

from .conftest import TINY_MODEL
from .live_server import LiveServer, ManagedProcess, base_env
from .services import RedisServer, require_binary

pytestmark = pytest.mark.scale_out

SKEWED_CLOCK = "import time\n_real = time.time\ntime.time = lambda: _real() - 60\n"


def test_a_job_the_web_side_gave_up_on_never_runs_on_a_worker_whose_clock_is_behind(hf_cache, tmp_path):
    """The web side answers 503 no_worker; a worker that starts later (its clock a minute behind the
    web machine's) must not run the abandoned job: giving up cancels it, no wall clocks compared."""
    require_binary("redis-server")
    (tmp_path / "redis").mkdir()
    redis = RedisServer(tmp_path / "redis")
    env = base_env(hf_cache, tmp_path, CHANNEL_LAYER_URL=redis.url, INFERENCE_WORKER_ACK_TIMEOUT="3")
    web = LiveServer(env, tmp_path, extra_args=("--no-worker",), name="web")
    worker = None
    try:
        response = httpx.post(f"{web.base_url}/v1/completions", headers=web.headers, timeout=30,
                              json={"model": TINY_MODEL, "prompt": "abandoned", "max_tokens": 2})
        assert response.status_code == 503 and response.json()["error"]["code"] == "no_worker"
        skew = tmp_path / "skew"
        skew.mkdir()
        (skew / "sitecustomize.py").write_text(SKEWED_CLOCK)
        worker_env = {**env, "PYTHONPATH": f"{skew}:{env.get('PYTHONPATH', '')}".rstrip(":")}
        worker = ManagedProcess(["manage.py", "run_worker"], worker_env, tmp_path / "worker.log")
        worker.wait_for_log("listening on channel")
        time.sleep(3)  # the abandoned job, still in the shared channel, is read by now
        # A worker's first job imports torch: on a busy machine its acknowledgement can miss the 3 s this web
        # waits; a job given up that way is cancelled like the first and must not run either (checked below).
        for _ in range(5):
            response = httpx.post(f"{web.base_url}/v1/completions", headers=web.headers, timeout=60,
                                  json={"model": TINY_MODEL, "prompt": "fresh", "max_tokens": 2})
            if response.status_code != 503:
                break
        assert response.status_code == 200, response.text
        time.sleep(1)
        finished = [line for line in worker.log().splitlines() if "INFO workers.engine.output.processor" in line and " finished " in line]
        assert len(finished) == 1, f"the worker ran a job nobody waits for: {finished}"
        assert response.json()["id"] in finished[0]
    finally:
        if worker is not None:
            worker.stop()
        web.stop()
        redis.stop()
