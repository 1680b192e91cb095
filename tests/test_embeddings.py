"""`POST /v1/embeddings` against a real server, through the openai SDK, with sentence-transformers as the reference."""
from __future__ import annotations

import base64
import struct

import httpx
import numpy as np
import openai
import pytest
from openai import OpenAI

from workers.tiny.encoder import HIDDEN

from .conftest import CAUSAL_EMBEDDER, ENCODER, TINY_MODEL, snapshot_of
from .live_server import LiveServer, base_env
from .teams_setup import fresh_minute, make_teams, wait_for_rows

TEXTS = ["Once upon a time", "the quick brown fox jumps over the lazy dog", "a", "Hello, world! " * 5]


@pytest.fixture(scope="module")
def live(embed_cache, tmp_path_factory):
    cache, _ = embed_cache
    work = tmp_path_factory.mktemp("embed-server")
    env = base_env(cache, work, INFERENCE_WORKER_ACK_TIMEOUT="120", INFERENCE_LEDGER_FLUSH_SECONDS="0.2",
                   INFERENCE_EMBEDDING_BATCH="3")
    server = LiveServer(env, work)
    server.secrets = make_teams(env, {"embedders": ["--rpm", "3"]}, {"embedder": ["--team", "embedders"]})
    yield server
    server.stop()


@pytest.fixture(scope="module")
def client(live) -> OpenAI:
    return OpenAI(base_url=f"{live.base_url}/v1", api_key=live.key, max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def reference(embed_cache):
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(str(embed_cache[1]), device="cpu")


def test_vectors_equal_sentence_transformers_for_every_input_shape(client, reference):
    expected = reference.encode(TEXTS, convert_to_numpy=True)
    # The SDK asks for base64 by default and decodes it; float asked for explicitly comes as JSON numbers.
    for encoding_format in (openai.NOT_GIVEN, "float"):
        response = client.embeddings.create(model=ENCODER, input=TEXTS, encoding_format=encoding_format)
        assert [item.index for item in response.data] == list(range(len(TEXTS)))
        got = np.array([item.embedding for item in response.data])
        assert got.shape == (len(TEXTS), HIDDEN)
        np.testing.assert_allclose(got, expected, atol=1e-5)
    single = client.embeddings.create(model=ENCODER, input=TEXTS[1])
    np.testing.assert_allclose(single.data[0].embedding, expected[1], atol=1e-5)
    assert single.model == ENCODER and single.object == "list"
    tokenizer = reference.tokenizer
    ids = [tokenizer(text)["input_ids"] for text in TEXTS[:2]]
    assert client.embeddings.create(model=ENCODER, input=ids[0]).usage.prompt_tokens == len(ids[0])
    by_ids = client.embeddings.create(model=ENCODER, input=ids)
    np.testing.assert_allclose([d.embedding for d in by_ids.data], expected[:2], atol=1e-5)
    assert by_ids.usage.prompt_tokens == by_ids.usage.total_tokens == sum(map(len, ids))


def test_base64_is_little_endian_float32(live, reference):
    body = httpx.post(f"{live.base_url}/v1/embeddings", headers=live.headers, timeout=120,
                      json={"model": ENCODER, "input": TEXTS[0], "encoding_format": "base64", "user": "u1"}).json()
    raw = base64.b64decode(body["data"][0]["embedding"])
    vector = struct.unpack(f"<{len(raw) // 4}f", raw)
    np.testing.assert_allclose(vector, reference.encode(TEXTS[0]), atol=1e-5)


def test_dimensions_truncate_and_renormalise(client, reference):
    full = reference.encode(TEXTS[:2])
    response = client.embeddings.create(model=ENCODER, input=TEXTS[:2], dimensions=16, encoding_format="float")
    got = np.array([d.embedding for d in response.data])
    expected = full[:, :16] / np.linalg.norm(full[:, :16], axis=1, keepdims=True)
    np.testing.assert_allclose(got, expected, atol=1e-5)
    np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-5)
    with pytest.raises(openai.BadRequestError) as too_many:
        client.embeddings.create(model=ENCODER, input="x", dimensions=HIDDEN + 1)
    assert too_many.value.body["param"] == "dimensions"


def test_many_concurrent_requests_are_batched_and_each_gets_its_own(live, client, reference):
    import concurrent.futures

    texts = [f"sentence number {i} about {'cats' if i % 2 else 'dogs'}" for i in range(10)]
    expected = reference.encode(texts)
    with concurrent.futures.ThreadPoolExecutor(5) as pool:
        answers = list(pool.map(lambda t: client.embeddings.create(model=ENCODER, input=[t, t[:5]],
                                                                   encoding_format="float"), texts))
    for answer, want, text in zip(answers, expected, texts):
        np.testing.assert_allclose(answer.data[0].embedding, want, atol=1e-5)
        np.testing.assert_allclose(answer.data[1].embedding, reference.encode(text[:5]), atol=1e-5)


def test_models_list_says_which_models_embed(client):
    models = {model.id: model.model_dump() for model in client.models.list().data}
    assert models[ENCODER]["tasks"] == ["embed", "score"]  # embedding models also answer /v1/score and /v1/rerank
    assert models[TINY_MODEL]["tasks"] == ["generate"]


def test_refusals_are_openai_shaped(live, client):
    with pytest.raises(openai.BadRequestError) as generating:
        client.embeddings.create(model=TINY_MODEL, input="hello")
    assert "does not produce embeddings" in generating.value.message
    with pytest.raises(openai.BadRequestError) as chat:
        client.chat.completions.create(model=ENCODER, messages=[{"role": "user", "content": "hi"}])
    assert "/v1/embeddings" in chat.value.message
    for body, param in [({"model": ENCODER, "input": ""}, "input"), ({"model": ENCODER, "input": []}, "input"),
                        ({"model": ENCODER, "input": [1, "a"]}, "input"),
                        ({"model": ENCODER, "input": "a", "encoding_format": "int8"}, "encoding_format"),
                        ({"model": ENCODER, "input": "a", "dimensions": 0}, "dimensions"),
                        ({"model": ENCODER, "input": "a", "nope": 1}, "nope"),
                        ({"model": ENCODER, "input": [[10**9]]}, "input"),
                        ({"model": ENCODER, "input": "word " * 400}, "input")]:
        response = httpx.post(f"{live.base_url}/v1/embeddings", headers=live.headers, json=body, timeout=120)
        assert response.status_code == 400, (body, response.text)
        assert response.json()["error"]["param"] == param, response.text
    missing = httpx.post(f"{live.base_url}/v1/embeddings", headers=live.headers, timeout=60,
                         json={"model": "local/nothing", "input": "a"})
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "model_not_found"


def test_embeddings_count_against_the_teams_requests_and_tokens(live):
    fresh_minute(20)
    team = OpenAI(base_url=f"{live.base_url}/v1", api_key=live.secrets["embedder"], max_retries=0, timeout=120)
    used = [team.embeddings.create(model=ENCODER, input=TEXTS[:2]).usage.prompt_tokens for _ in range(3)]
    with pytest.raises(openai.RateLimitError):
        team.embeddings.create(model=ENCODER, input="one more")
    served = wait_for_rows(live, "embedders", 3, keep=lambda row: row["prompt_tokens"] > 0)
    rows = [(row["endpoint"], row["prompt_tokens"], row["completion_tokens"]) for row in served]
    assert sorted(rows) == sorted(("/v1/embeddings", tokens, 0) for tokens in used)


def test_a_causal_lm_pools_its_last_token_as_its_config_says(embed_cache, client):
    from sentence_transformers import SentenceTransformer

    reference = SentenceTransformer(str(snapshot_of(embed_cache[0], CAUSAL_EMBEDDER)), device="cpu")
    assert reference[1].get_config_dict()["pooling_mode"] == "lasttoken"
    response = client.embeddings.create(model=CAUSAL_EMBEDDER, input=TEXTS, encoding_format="float")
    np.testing.assert_allclose([d.embedding for d in response.data], reference.encode(TEXTS), atol=1e-5)
    with pytest.raises(openai.BadRequestError):  # no matryoshka in its config: only the full size
        client.embeddings.create(model=CAUSAL_EMBEDDER, input="x", dimensions=8)


def test_rerank_orders_documents_by_cosine_similarity(live, reference):
    query, documents = "a dog in the park", ["the cat sat", "a dog runs in the park", "stock prices fell", "dogs"]
    vectors = reference.encode([query, *documents])
    scores = [float(np.dot(vectors[0], v) / (np.linalg.norm(vectors[0]) * np.linalg.norm(v))) for v in vectors[1:]]
    order = sorted(range(len(documents)), key=lambda i: -scores[i])
    for path in ("/v1/rerank", "/rerank"):
        response = httpx.post(f"{live.base_url}{path}", headers=live.headers, timeout=120,
                              json={"model": ENCODER, "query": query, "documents": documents, "top_n": 3})
        assert response.status_code == 200, response.text
        results = response.json()["results"]
        assert [r["index"] for r in results] == order[:3]
        np.testing.assert_allclose([r["relevance_score"] for r in results], [scores[i] for i in order[:3]], atol=1e-5)
        assert results[0]["document"] == {"text": documents[order[0]]}
    refused = httpx.post(f"{live.base_url}/v1/rerank", headers=live.headers, timeout=60,
                         json={"model": TINY_MODEL, "query": "q", "documents": ["d"]})
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "model"
    empty = httpx.post(f"{live.base_url}/v1/rerank", headers=live.headers, timeout=60,
                       json={"model": ENCODER, "query": "q", "documents": []})
    assert empty.status_code == 400 and empty.json()["error"]["param"] == "documents"
