"""How the worker batches embedding inputs (workers.engine.tasks.embedding.advance_embeddings), on the real tiny encoder.

A request's inputs are sorted by length across all of them, as sentence-transformers' `encode` sorts a
call's inputs, so a large request pads no more than `encode` would; newer requests' inputs join a forward
only from a bounded window, so none waits behind more than a few batches.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

from protocol.model_ref import ModelRef

from .conftest import ENCODER

WORDS = ["lighthouse", "river", "robot", "market", "winter", "letter", "garden", "map", "violin", "harbor"]


def texts(count: int, offset: int = 0) -> list[str]:
    """Texts of 1 to 19 words, their lengths in no order."""
    return [" ".join(WORDS[(i * 7 + j) % len(WORDS)] for j in range(1 + (i * 11) % 19))
            for i in range(offset, offset + count)]


@pytest.fixture(scope="module")
def encoder(embed_cache):
    from huggingface_hub import constants

    from workers.engine.models.model_loader import load_model

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(constants, "HF_HUB_CACHE", str(embed_cache[0]))
        return load_model(ModelRef(ENCODER), device="cpu")


def job(encoder, name: str, inputs: list[str]):
    from workers.engine.tasks.embedding import EmbeddingJob

    return EmbeddingJob({"request_id": name, "reply_channel": "nowhere",
                         "prompts": [{"embed": text} for text in inputs]}, encoder)


def run_forwards(encoder, jobs: list, batch: int) -> list[list[tuple[str, int]]]:
    """Every forward's rows as (request id, input index), run until each job is done."""
    from workers.engine.tasks.embedding import advance_embeddings

    forwards: list[list[tuple[str, int]]] = []
    while any(j.left for j in jobs):
        before = {j.request_id: set(j.left) for j in jobs}
        with torch.inference_mode():
            advance_embeddings(jobs, batch)
        forwards.append([(j.request_id, i) for j in jobs for i in sorted(before[j.request_id] - set(j.left))])
    return forwards


def padded_tokens(lengths: list[int], batches: list[list[int]]) -> int:
    return sum(max(lengths[i] for i in rows) * len(rows) for rows in batches)


def test_one_large_request_pads_as_encode_does(encoder, embed_cache):
    from sentence_transformers import SentenceTransformer

    inputs = texts(200)
    request = job(encoder, "big", inputs)
    lengths = [len(ids) for ids in request.inputs]
    forwards = run_forwards(encoder, [request], batch=16)
    assert all(len(rows) == 16 for rows in forwards[:-1])
    # encode sorts the whole call by length: the same padding, forward by forward
    by_length = sorted(range(len(inputs)), key=lambda i: -lengths[i])
    assert padded_tokens(lengths, [[i for _, i in rows] for rows in forwards]) == \
        padded_tokens(lengths, [by_length[k:k + 16] for k in range(0, len(inputs), 16)])
    widths = [max(lengths[i] for _, i in rows) for rows in forwards]
    assert widths == sorted(widths, reverse=True)
    expected = SentenceTransformer(str(embed_cache[1]), device="cpu").encode(inputs, batch_size=16)
    got = np.array([delta["embedding"] for delta in request.take_deltas()])
    np.testing.assert_allclose(got, expected, atol=1e-5)


def test_short_inputs_are_not_overtaken_for_ever_by_newer_long_ones(encoder):
    from workers.engine.tasks.embedding import OVERTAKEN_AT_MOST, advance_embeddings

    batch = 4
    short = job(encoder, "short", ["map"] * 12)
    jobs = [short]
    forwards = 0
    while short.left:  # a newer request of long texts arrives before every forward
        jobs.append(job(encoder, f"long-{forwards}", [" ".join(WORDS * 2)] * batch))
        with torch.inference_mode():
            advance_embeddings([j for j in jobs if j.left], batch)
        forwards += 1
        assert forwards <= len(short.inputs) // batch + OVERTAKEN_AT_MOST, "the short request waits for ever"
    assert short.overtaken == OVERTAKEN_AT_MOST  # the long ones did go first while it could wait
    assert short.finished
