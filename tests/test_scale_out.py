"""Scale-out: the web server and separate worker processes meet only through a real Redis."""
from __future__ import annotations

import asyncio

import pytest
from openai import AsyncOpenAI

from .conftest import TINY_MODEL
from .live_server import LiveServer, ManagedProcess, base_env
from .services import PostgresServer
from .helpers.catalog import set_fields

pytestmark = pytest.mark.scale_out


@pytest.fixture(scope="module")
def postgres_server():
    server = PostgresServer()
    yield server
    server.stop()


def test_web_and_two_workers_over_redis_with_postgres(hf_cache, tmp_path, redis_server, postgres_server, reference):
    metrics_dir = tmp_path / "prometheus"  # every process writes its metrics here; one scrape merges them
    metrics_dir.mkdir()
    env = base_env(hf_cache, tmp_path, CHANNEL_LAYER_URL=redis_server.url, DATABASE_URL=postgres_server.url,
                   INFERENCE_WORKER_ACK_TIMEOUT="5", PROMETHEUS_MULTIPROC_DIR=str(metrics_dir))
    web = LiveServer(env, tmp_path, extra_args=("--no-worker",), name="web")
    workers = []
    try:
        prompts = ["Once upon a time", "The capital of France is", "1, 2, 3,", "Hello"]
        # No worker yet: the web side answers 503 rather than hanging.
        import httpx

        response = httpx.post(f"{web.base_url}/v1/completions", headers=web.headers, timeout=30,
                              json={"model": TINY_MODEL, "prompt": "hi", "max_tokens": 2})
        assert response.status_code == 503
        assert response.json()["error"]["code"] == "no_worker"

        # Both workers load the model at start (the catalog's preload), so both hold it when the jobs come:
        # a worker passes a job for a model another one holds to that holder rather than load a second
        # copy, so on a busy machine a late reader would otherwise never take one.
        set_fields(env, TINY_MODEL, preload=True)
        for index in range(2):
            worker = ManagedProcess(["manage.py", "run_worker"], env, tmp_path / f"worker{index}.log")
            workers.append(worker)
        for worker in workers:
            worker.wait_for_log("loaded local/tiny-llama@main on")

        async def run_all():
            client = AsyncOpenAI(base_url=f"{web.base_url}/v1", api_key=web.key, max_retries=0, timeout=120)
            plain = [client.completions.create(model=TINY_MODEL, prompt=p, max_tokens=12, temperature=0) for p in prompts * 2]
            streamed = [client.completions.create(model=TINY_MODEL, prompt=p, max_tokens=12, temperature=0, stream=True)
                        for p in prompts]
            results = await asyncio.gather(*plain)
            texts = []
            for stream in await asyncio.gather(*streamed):
                texts.append("".join([chunk.choices[0].text async for chunk in stream if chunk.choices]))
            return [r.choices[0].text for r in results], texts

        plain_texts, streamed_texts = asyncio.run(run_all())
        expected = [reference.decode(reference.greedy(reference.encode(p), 12)) for p in prompts]
        assert plain_texts == expected * 2
        assert streamed_texts == expected
        serving = [w for w in workers if "finished cmpl-" in w.log()]
        assert len(serving) == 2, "both workers should have taken jobs"
        # One scrape of the web process sees both workers' engines.
        from .helpers.metrics import scrape, value

        metrics = scrape(web)
        generated = 3 * sum(len(reference.greedy(reference.encode(p), 12)) for p in prompts)
        assert value(metrics, "vllm:generation_tokens_total") == generated
        assert value(metrics, "vllm:time_to_first_token_seconds_count") == len(prompts) * 3
        assert value(metrics, "inference_workers", 'status="online"') == 2
        # The web side's state (migrations, the API key it created) lives in PostgreSQL.
        import psycopg

        with psycopg.connect(postgres_server.url) as connection:
            count = connection.execute("select count(*) from teams_apikey").fetchone()[0]
        assert count == 1
    finally:
        for worker in workers:
            worker.stop()
        web.stop()
