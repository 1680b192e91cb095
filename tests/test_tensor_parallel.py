"""Tensor parallel through the real server: 2 gloo ranks on CPU (`INFERENCE_TENSOR_PARALLEL_SIZE=2`, what
`serve --tensor-parallel-size 2` sets), each split model greedy-equal to single-process `generate`.

One family per kind of cache whose architecture has a transformers tensor-parallel plan (full attention, MLA,
every layer sliding, sliding beside full, linear attention beside full, Mamba beside attention), with prompts
that prefill together, in chunks (64-token chunks, a 179-token prompt) and from the prefix cache; the prompts
scored (echo + logprobs) as the model does; a rank killed mid-stream (the client hears within seconds, the
model is loaded again and serves, the catalog's history says why); and each refusal with its reason. One split
model per worker: each family's first request evicts the previous one.
"""
from __future__ import annotations

import asyncio
import os
import re
import signal
import time

import httpx
import pytest
import torch

from workers.tiny.families import build_tiny_families
from workers.tiny.lora import build_tiny_lora

from . import test_model_families as families
from .live_server import LiveServer, base_env, clients
from .test_model_families import PROMPTS, complete, greedy, model_id, reference_of

SPLIT_FAMILIES = ["llama", "deepseek-v3", "mistral", "gemma3", "qwen3.5", "jamba"]
ADAPTER = "local/tiny-lora-split"
RANK_LINE = re.compile(r"tensor parallel over 2 ranks \(gloo, rank 1 pid (\d+)\)")


@pytest.fixture(scope="module")
def split_cache(tmp_path_factory):
    cache = tmp_path_factory.mktemp("split-cache")
    build_tiny_families([*SPLIT_FAMILIES, "mamba"], cache_dir=cache)
    build_tiny_lora(ADAPTER, model_id("llama"), cache_dir=cache)
    return cache


@pytest.fixture(scope="module")
def split_server(split_cache, tmp_path_factory):
    work_dir = tmp_path_factory.mktemp("split-server")
    live = LiveServer(base_env(split_cache, work_dir, INFERENCE_PREFILL_CHUNK="64", INFERENCE_TENSOR_PARALLEL_SIZE="2"),
                      work_dir, name="split")
    yield live
    live.stop()


@pytest.mark.parametrize("family", SPLIT_FAMILIES)
def test_a_split_model_gives_what_generate_gives_alone_batched_chunked_and_cached(split_cache, split_server, family):
    expected = [greedy(split_cache, family, tuple(prompt)) for prompt in PROMPTS]
    _, client = clients(split_server)
    model = model_id(family)

    async def run():
        alone = await complete(client, model, [PROMPTS[1]])  # loads it (evicting the last family's ranks)
        at_once = await asyncio.gather(*[complete(client, model, [prompt]) for prompt in PROMPTS])
        again = await asyncio.gather(*[complete(client, model, [prompt]) for prompt in PROMPTS])  # prefix-cache hits
        in_one = await complete(client, model, PROMPTS)
        return alone, at_once, again, in_one

    alone, at_once, again, in_one = asyncio.run(run())
    assert alone == [expected[1]], "alone"
    assert [tokens for [tokens] in at_once] == expected, "sent at once"
    assert [tokens for [tokens] in again] == expected, "sent again (prefix cache)"
    assert in_one == expected, "four prompts in one request"
    assert f"local/tiny-{family}@main: tensor parallel over 2 ranks" in split_server.log()


def test_a_split_model_scores_a_prompt_as_the_model_does_and_counts_every_rank_s_memory(split_cache, split_server):
    prompt = PROMPTS[2]
    reference = reference_of(split_cache, "llama")
    with torch.no_grad():
        logits = reference.model(torch.tensor([prompt])).logits[0].float()
    expected = torch.log_softmax(logits, dim=-1)[torch.arange(len(prompt) - 1), torch.tensor(prompt[1:])].tolist()
    client, _ = clients(split_server)
    response = client.completions.create(model=model_id("llama"), prompt=[prompt], max_tokens=0, echo=True, logprobs=1)
    assert response.choices[0].logprobs.token_logprobs[1:] == pytest.approx(expected, abs=1e-4)
    listed = {m.id: m for m in client.models.list().data}
    whole = sum(p.numel() * p.element_size() for p in reference.model.parameters())
    # both ranks' shares: the sharded weights once, what every rank keeps whole (norms, embeddings) twice
    assert whole < listed[model_id("llama")].model_extra["memory_bytes"] < 2 * whole


def test_a_split_model_samples_n_choices_with_logprobs_and_grammars_and_resumes_paused_rows(split_cache,
                                                                                         split_server):
    """What rank 0 alone does (sampling, logprobs, grammars) beside what every rank mirrors (a prompt's
    prefill shared by its choices, rows paused for interactive work and joining again)."""
    model, prompt = model_id("llama"), PROMPTS[2]
    expected = greedy(split_cache, "llama", tuple(prompt))
    client, _ = clients(split_server)
    answer = client.completions.create(model=model, prompt=[prompt], n=2, max_tokens=len(expected), temperature=0,
                                       logprobs=1, extra_body={"ignore_eos": True, "return_token_ids": True})
    assert [choice.model_extra["token_ids"] for choice in answer.choices] == [expected, expected]
    with torch.no_grad():
        logits = reference_of(split_cache, "llama").model(torch.tensor([prompt + expected])).logits[0].float()
    chosen = torch.log_softmax(logits[len(prompt) - 1:-1], dim=-1)[torch.arange(len(expected)), torch.tensor(expected)]
    assert answer.choices[0].logprobs.token_logprobs == pytest.approx(chosen.tolist(), abs=1e-4)
    pattern = "[A-Z][a-z]{2,6} [0-9]{2}"
    constrained = client.completions.create(model=model, prompt="Label:", n=3, temperature=1.0, seed=4, max_tokens=30,
                                            extra_body={"structured_outputs": {"regex": pattern}})
    assert all(re.fullmatch(pattern, choice.text) for choice in constrained.choices), constrained.choices
    families.test_rows_paused_for_interactive_work_resume_exactly(split_cache, split_server, "llama")


def test_streams_cancelled_mid_flight_leave_the_ranks_in_step(split_cache, split_server):
    """Rows that end early (cancelled streams) leave rank 0 and every follower alike: the streams beside them
    and every request after them still equal `generate`."""
    model = model_id("llama")
    prompts = [PROMPTS[i % len(PROMPTS)][: 4 + i] for i in range(8)]
    expected = [greedy(split_cache, "llama", tuple(prompt), 48) for prompt in prompts]

    async def run():
        _, client = clients(split_server)

        async def stream(prompt, cancel_after):
            response = await client.completions.create(
                model=model, prompt=[prompt], max_tokens=48, temperature=0, stream=True,
                extra_body={"ignore_eos": True, "return_token_ids": True})
            ids = []
            async for chunk in response:
                ids.extend(chunk.choices[0].model_extra.get("token_ids") or [])
                if cancel_after is not None and len(ids) >= cancel_after:
                    await response.close()
                    return None
            return ids

        return await asyncio.gather(*[stream(p, 3 + i if i % 3 == 0 else None) for i, p in enumerate(prompts)])

    for _ in range(2):
        results = asyncio.run(run())
        assert [r for r in results if r is not None] == [e for i, e in enumerate(expected) if i % 3 != 0]
    assert asyncio.run(complete(clients(split_server)[1], model, prompts)) == [e[:16] for e in expected]


@pytest.mark.parametrize("kill", ["SIGKILL", "SIGABRT"])
def test_a_rank_killed_mid_stream_fails_its_requests_at_once_and_the_model_comes_back(split_cache, split_server, kill):
    """SIGABRT is how a native library's uncaught error ends a rank: its Python stacks are in the log too."""
    model = model_id("llama")
    client, async_client = clients(split_server)
    client.completions.create(model=model, prompt="load it", max_tokens=1)
    follower = int(RANK_LINE.findall(split_server.log())[-1])
    logged_before = len(split_server.log())

    async def run():
        stream = await async_client.completions.create(model=model, prompt=[PROMPTS[0]], max_tokens=1500,
                                                       temperature=0, stream=True, extra_body={"ignore_eos": True})
        received, killed_at = 0, None
        try:
            async for chunk in stream:
                received += 1
                if received == 5:
                    os.kill(follower, getattr(signal, kill))
                    killed_at = time.monotonic()
        except Exception as exc:  # the SDK raises the stream's error event
            return received, exc, time.monotonic() - killed_at
        return received, None, None

    received, error, heard_after = asyncio.run(run())
    # the rank that died is named once its exit is seen (within a second); the group's failure is said always
    assert error is not None and "tensor-parallel group is down" in str(error), (received, error)
    assert error.body.get("code") == "model_restarting", error.body  # a 503 in the stream: retrying may succeed
    assert heard_after < 10
    expected = greedy(split_cache, "llama", tuple(PROMPTS[1]))
    deadline = time.monotonic() + 90
    while True:  # the model is loaded again; a request meanwhile waits for that load or hears it restarting
        try:
            assert asyncio.run(complete(clients(split_server)[1], model, [PROMPTS[1]])) == [expected]
            break
        except Exception as exc:
            assert "503" in str(exc) or "restarting" in str(exc) or "loaded again" in str(exc), exc
            assert time.monotonic() < deadline, "the model never came back"
            time.sleep(1)
    assert int(RANK_LINE.findall(split_server.log())[-1]) != follower  # a new rank 1
    history = httpx.get(f"{split_server.base_url}/v1/models", headers=split_server.headers, timeout=30)
    assert history.status_code == 200
    logged = split_server.log()[logged_before:]
    assert "unloaded local/tiny-llama@main (fault)" in logged
    if kill == "SIGABRT":
        aborted = logged.split("Fatal Python error: Aborted", 1)
        assert len(aborted) == 2 and "parallel/follower.py" in aborted[1], "the rank's stacks are not in the log"


def test_what_cannot_be_split_is_refused_with_its_reason(split_server):
    client, _ = clients(split_server)
    with pytest.raises(Exception) as refused:
        client.completions.create(model=model_id("mamba"), prompt="hi", max_tokens=2)
    assert "no tensor-parallel plan for its architecture (mamba)" in str(refused.value)
    assert refused.value.status_code == 503 and refused.value.body["code"] == "model_load_failed"
    with pytest.raises(Exception) as unknown:  # refused before any rank is started
        client.completions.create(model="local/no-such-model", prompt="hi", max_tokens=2)
    assert unknown.value.status_code == 404 and "local/no-such-model: tensor parallel" not in split_server.log()
    with pytest.raises(Exception) as adapter:
        client.completions.create(model=ADAPTER, prompt="hi", max_tokens=2)
    assert "split over several ranks (tensor parallel), which serves no adapters" in str(adapter.value)
    with pytest.raises(Exception) as beams:
        client.completions.create(model=model_id("llama"), prompt="hi", max_tokens=2,
                                  n=2, extra_body={"use_beam_search": True})
    assert getattr(beams.value, "status_code", None) == 400
    assert "beam search" in beams.value.body["message"]
    assert client.completions.create(model=model_id("llama"), prompt="still serving", max_tokens=2).choices


@pytest.mark.scale_out
def test_a_scale_out_worker_splits_its_models_over_ranks(hf_cache, tmp_path, redis_server, reference):
    """`run_worker --tensor-parallel-size 2` beside `serve --no-worker`, over Redis: the same answers."""
    from openai import OpenAI

    from .conftest import TINY_MODEL
    from .live_server import ManagedProcess

    env = base_env(hf_cache, tmp_path, CHANNEL_LAYER_URL=redis_server.url, INFERENCE_WORKER_ACK_TIMEOUT="30")
    web = LiveServer(env, tmp_path, extra_args=("--no-worker",), name="web")
    worker = ManagedProcess(["manage.py", "run_worker", "--tensor-parallel-size", "2"], env, tmp_path / "worker.log")
    try:
        client = OpenAI(base_url=f"{web.base_url}/v1", api_key=web.key, max_retries=0, timeout=120)
        prompts = ["Once upon a time", "The capital of France is", "1, 2, 3,"]
        deadline = time.monotonic() + 60
        while True:  # until the worker has registered
            try:
                answer = client.completions.create(model=TINY_MODEL, prompt=prompts, max_tokens=12, temperature=0)
                break
            except Exception as exc:
                assert "no_worker" in str(exc) and time.monotonic() < deadline, exc
                time.sleep(0.5)
        expected = [reference.decode(reference.greedy(reference.encode(p), 12)) for p in prompts]
        assert [choice.text for choice in sorted(answer.choices, key=lambda c: c.index)] == expected
        assert "local/tiny-llama@main: tensor parallel over 2 ranks" in worker.log()
    finally:
        worker.stop()
        web.stop()
    assert "tensor-parallel ranks stopped" in worker.log()


def test_a_models_own_tensor_parallel_size_wins_and_each_refusal_says_why(split_cache, tmp_path):
    """Per model in a config file's `models:` (the admin's field alike), over a server that splits nothing."""
    import yaml

    config = {"models": [{"name": model_id("gemma3"), "tensor_parallel_size": 2},
                         {"name": model_id("llama"), "tensor_parallel_size": 3},
                         {"name": model_id("mistral"), "tensor_parallel_size": 2, "quantization": "torchao-int8"}]}
    (tmp_path / "server.yaml").write_text(yaml.safe_dump(config))
    live = LiveServer(base_env(split_cache, tmp_path), tmp_path, ("--config", str(tmp_path / "server.yaml")),
                      name="per-model")
    try:
        client, async_client = clients(live)
        expected = greedy(split_cache, "gemma3", tuple(PROMPTS[2]))
        assert asyncio.run(complete(async_client, model_id("gemma3"), [PROMPTS[2]])) == [expected]
        assert "local/tiny-gemma3@main: tensor parallel over 2 ranks" in live.log()
        for model, reason in ((model_id("llama"), "its num_attention_heads (4) does not divide by 3"),
                              (model_id("mistral"), "quantized weights are not sharded")):
            with pytest.raises(Exception) as refused:
                client.completions.create(model=model, prompt="hi", max_tokens=2)
            assert f"cannot be served with tensor_parallel_size=" in str(refused.value), refused.value
            assert reason in str(refused.value), refused.value
    finally:
        live.stop()
