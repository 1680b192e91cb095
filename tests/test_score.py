"""`POST /v1/score` and `/v1/rerank` against a real server: a cross-encoder compared with sentence-transformers'
`CrossEncoder.predict`, an embedding model with the cosine of `SentenceTransformer.encode`'s vectors."""
from __future__ import annotations

import concurrent.futures

import httpx
import numpy as np
import openai
import pytest
import torch
from openai import OpenAI

from .conftest import CROSS_ENCODER, ENCODER, TINY_MODEL, snapshot_of
from .live_server import LiveServer, base_env
from .teams_setup import fresh_minute, make_teams, wait_for_rows

QUERIES = ["a dog in the park", "what is the capital of France?"]
DOCUMENTS = ["the cat sat on the mat", "a dog runs in the park", "stock prices fell sharply today", "dogs",
             "Paris is the capital of France."]


@pytest.fixture(scope="module")
def live(embed_cache, tmp_path_factory):
    work = tmp_path_factory.mktemp("score-server")
    env = base_env(embed_cache[0], work, INFERENCE_WORKER_ACK_TIMEOUT="120", INFERENCE_LEDGER_FLUSH_SECONDS="0.2",
                   INFERENCE_EMBEDDING_BATCH="3")
    server = LiveServer(env, work)
    server.secrets = make_teams(env, {"scorers": ["--rpm", "2"]}, {"scorer": ["--team", "scorers"]})
    yield server
    server.stop()


@pytest.fixture(scope="module")
def cross_encoder(embed_cache):
    from sentence_transformers import CrossEncoder

    return CrossEncoder(str(snapshot_of(embed_cache[0], CROSS_ENCODER)), device="cpu")


@pytest.fixture(scope="module")
def encoder(embed_cache):
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(str(embed_cache[1]), device="cpu")


def post(live, path: str, body: dict, key: str | None = None) -> httpx.Response:
    headers = live.headers if key is None else {"Authorization": f"Bearer {key}"}
    return httpx.post(f"{live.base_url}{path}", headers=headers, json=body, timeout=120)


def scores_of(live, body: dict, path: str = "/v1/score") -> list[float]:
    response = post(live, path, body)
    assert response.status_code == 200, response.text
    payload = response.json()
    assert payload["object"] == "list" and payload["model"] == body["model"]
    assert payload["id"].startswith("score-") and isinstance(payload["created"], int)
    assert [item["index"] for item in payload["data"]] == list(range(len(payload["data"])))
    assert all(item["object"] == "score" for item in payload["data"])
    usage = payload["usage"]
    assert usage["prompt_tokens"] == usage["total_tokens"] > 0 and usage["completion_tokens"] == 0
    return [item["score"] for item in payload["data"]]


def cosines(encoder, pairs: list[tuple[str, str]]) -> list[float]:
    first = encoder.encode([a for a, _ in pairs])
    second = encoder.encode([b for _, b in pairs])
    return [float(np.dot(a, b) / (np.linalg.norm(a) * np.linalg.norm(b))) for a, b in zip(first, second)]


def test_cross_encoder_scores_equal_cross_encoder_predict_one_to_one_one_to_many_and_pairwise(live, cross_encoder):
    cases = [({"text_1": QUERIES[0], "text_2": DOCUMENTS[1]}, [(QUERIES[0], DOCUMENTS[1])]),
             ({"text_1": QUERIES[0], "text_2": DOCUMENTS}, [(QUERIES[0], d) for d in DOCUMENTS]),
             ({"text_1": [QUERIES[1]], "text_2": DOCUMENTS[:2]}, [(QUERIES[1], d) for d in DOCUMENTS[:2]]),
             ({"queries": QUERIES, "documents": DOCUMENTS[3:]}, list(zip(QUERIES, DOCUMENTS[3:]))),
             ({"data_1": DOCUMENTS[:2], "data_2": QUERIES}, list(zip(DOCUMENTS[:2], QUERIES)))]
    for body, pairs in cases:
        expected = cross_encoder.predict(pairs)
        assert np.all((expected > 0) & (expected < 1))  # CrossEncoder's sigmoid over one label
        for path in ("/v1/score", "/score"):
            np.testing.assert_allclose(scores_of(live, {"model": CROSS_ENCODER, **body}, path), expected, atol=1e-5)
    pairs = [(QUERIES[0], d) for d in DOCUMENTS]
    raw = scores_of(live, {"model": CROSS_ENCODER, "text_1": QUERIES[0], "text_2": DOCUMENTS, "use_activation": False})
    np.testing.assert_allclose(raw, cross_encoder.predict(pairs, activation_fn=torch.nn.Identity()), atol=1e-5)


def test_a_pair_longer_than_the_model_is_truncated_as_cross_encoder_truncates_it(live, cross_encoder):
    long_document = " ".join(f"word{i} about dogs and parks" for i in range(80))
    pairs = [(QUERIES[0], long_document), (QUERIES[0], DOCUMENTS[0])]
    assert len(cross_encoder.tokenizer(*pairs[0])["input_ids"]) > cross_encoder.max_seq_length
    got = scores_of(live, {"model": CROSS_ENCODER, "text_1": QUERIES[0], "text_2": [p[1] for p in pairs]})
    np.testing.assert_allclose(got, cross_encoder.predict(pairs), atol=1e-5)


def test_embedding_model_scores_are_the_cosine_of_its_vectors(live, encoder):
    cases = [({"text_1": QUERIES[0], "text_2": DOCUMENTS[1]}, [(QUERIES[0], DOCUMENTS[1])]),
             ({"text_1": QUERIES[0], "text_2": DOCUMENTS}, [(QUERIES[0], d) for d in DOCUMENTS]),
             ({"queries": QUERIES, "items": DOCUMENTS[:2]}, list(zip(QUERIES, DOCUMENTS[:2]))),
             ({"text_1": [QUERIES[0], QUERIES[0]], "text_2": [QUERIES[0], DOCUMENTS[2]]},
              [(QUERIES[0], QUERIES[0]), (QUERIES[0], DOCUMENTS[2])])]
    for body, pairs in cases:
        got = scores_of(live, {"model": ENCODER, **body})
        np.testing.assert_allclose(got, cosines(encoder, pairs), atol=1e-5)
    assert scores_of(live, {"model": ENCODER, "text_1": "same text", "text_2": "same text"})[0] == pytest.approx(1.0)


def test_rerank_with_a_cross_encoder_orders_documents_as_the_reference(live, cross_encoder):
    expected = cross_encoder.predict([(QUERIES[0], d) for d in DOCUMENTS])
    order = sorted(range(len(DOCUMENTS)), key=lambda i: -expected[i])
    for path in ("/v1/rerank", "/rerank", "/v2/rerank"):
        response = post(live, path, {"model": CROSS_ENCODER, "query": QUERIES[0], "documents": DOCUMENTS, "top_n": 3})
        assert response.status_code == 200, response.text
        body = response.json()
        assert [r["index"] for r in body["results"]] == order[:3]
        np.testing.assert_allclose([r["relevance_score"] for r in body["results"]], expected[order[:3]], atol=1e-5)
        assert [r["document"] for r in body["results"]] == [{"text": DOCUMENTS[i]} for i in order[:3]]
        assert body["id"].startswith("rerank-") and body["usage"]["total_tokens"] > 0
    every = post(live, "/v1/rerank", {"model": CROSS_ENCODER, "query": QUERIES[0], "documents": DOCUMENTS,
                                      "top_n": 0, "return_documents": False}).json()["results"]
    assert [r["index"] for r in every] == order and all("document" not in r for r in every)


def test_concurrent_requests_of_both_kinds_are_batched_and_each_gets_its_own(live, cross_encoder, encoder):
    jobs = [(CROSS_ENCODER if i % 2 else ENCODER, f"query number {i} about {'cats' if i % 3 else 'dogs'}")
            for i in range(8)]

    def one(job):
        model, query = job
        return scores_of(live, {"model": model, "text_1": query, "text_2": DOCUMENTS[:3]})

    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        answers = list(pool.map(one, jobs))
    for (model, query), got in zip(jobs, answers):
        pairs = [(query, d) for d in DOCUMENTS[:3]]
        expected = cross_encoder.predict(pairs) if model == CROSS_ENCODER else cosines(encoder, pairs)
        np.testing.assert_allclose(got, expected, atol=1e-5)


def test_models_list_says_the_cross_encoder_scores(live):
    client = OpenAI(base_url=f"{live.base_url}/v1", api_key=live.key, max_retries=0, timeout=60)
    models = {model.id: model.model_dump() for model in client.models.list().data}
    assert models[CROSS_ENCODER]["tasks"] == ["score"] and models[CROSS_ENCODER]["modalities"] == ["text"]
    assert models[ENCODER]["tasks"] == ["embed", "score"]


def test_bad_requests_get_openai_shaped_errors(live):
    for body, param in [({"text_1": ["a", "b"], "text_2": ["c", "d", "e"]}, "text_2"),
                        ({"text_1": ["a", "b"], "text_2": "c"}, "text_2"),
                        ({"text_1": [], "text_2": "c"}, "text_1"),
                        ({"text_1": "a", "text_2": ""}, "text_2"),
                        ({"text_1": "a"}, "text_2"),
                        ({"queries": "a", "text_2": "b"}, "text_1"),
                        ({"text_1": "a", "text_2": [1]}, "text_2"),
                        ({"text_1": "a", "text_2": "b", "use_activation": "no"}, "use_activation"),
                        ({"text_1": "a", "text_2": "b", "nope": 1}, "nope")]:
        response = post(live, "/v1/score", {"model": CROSS_ENCODER, **body})
        assert response.status_code == 400, (body, response.text)
        assert response.json()["error"]["param"] == param, response.text
    for path, body in [("/v1/score", {"text_1": "a", "text_2": "b"}),
                       ("/v1/rerank", {"query": "q", "documents": ["d"]})]:
        generator = post(live, path, {"model": TINY_MODEL, **body})
        assert generator.status_code == 400 and generator.json()["error"]["param"] == "model", generator.text
        assert "does not score text pairs" in generator.json()["error"]["message"]
        missing = post(live, path, {"model": "local/nothing", **body})
        assert missing.status_code == 404 and missing.json()["error"]["code"] == "model_not_found"
    for body, param in [({"query": "q", "documents": []}, "documents"),
                        ({"query": "q", "documents": ["d"], "top_n": -1}, "top_n")]:
        response = post(live, "/v1/rerank", {"model": CROSS_ENCODER, **body})
        assert response.status_code == 400 and response.json()["error"]["param"] == param, response.text


def test_the_cross_encoder_serves_no_generation_and_no_embeddings(live):
    client = OpenAI(base_url=f"{live.base_url}/v1", api_key=live.key, max_retries=0, timeout=120)
    with pytest.raises(openai.BadRequestError) as chat:
        client.chat.completions.create(model=CROSS_ENCODER, messages=[{"role": "user", "content": "hi"}])
    assert chat.value.body["param"] == "model" and "/v1/score" in chat.value.message
    with pytest.raises(openai.BadRequestError) as completion:
        client.completions.create(model=CROSS_ENCODER, prompt="hi", max_tokens=2)
    assert "cross-encoder" in completion.value.message
    with pytest.raises(openai.BadRequestError) as embedding:
        client.embeddings.create(model=CROSS_ENCODER, input="hi")
    assert "does not produce embeddings" in embedding.value.message


def test_scores_count_against_the_teams_requests_and_tokens(live):
    fresh_minute(20)
    body = {"model": CROSS_ENCODER, "text_1": QUERIES[0], "text_2": DOCUMENTS[:2]}
    used = []
    for path in ("/v1/score", "/v1/rerank"):
        request = body if path == "/v1/score" else {"model": CROSS_ENCODER, "query": QUERIES[0],
                                                    "documents": DOCUMENTS[:2]}
        response = post(live, path, request, live.secrets["scorer"])
        assert response.status_code == 200, response.text
        used.append((path, response.json()["usage"]["prompt_tokens"], 0))
    assert used[0][1] == used[1][1]  # the same pairs: the same tokens
    limited = post(live, "/v1/score", body, live.secrets["scorer"])
    assert limited.status_code == 429 and limited.json()["error"]["type"] == "requests", limited.text
    served = wait_for_rows(live, "scorers", 2, keep=lambda row: row["prompt_tokens"] > 0)
    rows = [(row["endpoint"], row["prompt_tokens"], row["completion_tokens"]) for row in served]
    assert sorted(rows) == sorted(used)
