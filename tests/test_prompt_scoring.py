"""Echo + logprobs in linear time and in prefill chunks: the same output as decoding every prefix and one forward."""
from __future__ import annotations

import random
import uuid

import pytest
import torch

import protocol
from workers.engine.config import EngineConfig
from workers.engine.inputs.prompt_scoring import PrefixOffsets
from workers.engine.output.token_text import TokenText, settled_length

from .conftest import TINY_MODEL, engine_running
from .outbox import Outbox
from .helpers.engine import finished

TEXTS = [
    "Once upon a time there was a lighthouse keeper who counted the ships. " * 6,
    "Ünïcödé — naïve café, 東京タワー, emoji 🙂🚀 and 𝔘𝔫𝔦 letters; done.\n\ttabs  and   spaces ...",
    "def add(a, b):\n    return a + b\n\n\nclass Point:\n    x: int = 0\n" * 3,
]


def quadratic_offsets(tokenizer, ids: list[int]) -> list[int]:
    """What the engine used to compute: the decoded prompt prefix before every position."""
    return [settled_length(tokenizer.decode(ids[:i], skip_special_tokens=True)) for i in range(len(ids))]


@pytest.mark.parametrize("stride", [1, 3, 32])
def test_prefix_offsets_equal_decoding_every_prefix(reference, stride):
    tokenizer = reference.tokenizer
    rng = random.Random(stride)
    prompts = [reference.encode(text) for text in TEXTS]
    prompts.append([rng.randrange(len(tokenizer)) for _ in range(300)])  # any ids: split characters, specials
    for ids in prompts:
        offsets = PrefixOffsets(tokenizer, ids, stride=stride)
        expected = quadratic_offsets(tokenizer, ids)
        assert offsets.upto(len(ids) // 3) == expected[:len(ids) // 3]  # asked for in pieces, as chunks go
        assert offsets.upto(len(ids)) == expected


@pytest.fixture(scope="module")
def chunked_engine(hf_cache):
    """Prefill chunks of 16 tokens: every prompt below is scored over several engine steps."""
    outbox = Outbox()
    with engine_running(hf_cache, outbox.emit, EngineConfig(max_num_seqs=8, prefill_chunk=16)) as engine:
        yield engine, outbox


def run_job(engine_and_outbox, prompt, **params) -> list[dict]:
    engine, outbox = engine_and_outbox
    reply = f"reply.{uuid.uuid4().hex}"
    engine.submit(protocol.submit_message(f"cmpl-{uuid.uuid4().hex}", reply, protocol.ModelRef.parse(TINY_MODEL), [prompt],
                                          protocol.JobParams(temperature=0, echo=True, **params)))
    return outbox.wait_for(reply, finished)


def merged_logprobs(messages: list[dict], index: int = 0) -> dict:
    merged = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
    for message in messages:
        for choice in message.get("choices", []):
            if choice["index"] == index and choice["logprobs"]:
                for key in merged:
                    merged[key].extend(choice["logprobs"][key])
    return merged


@pytest.mark.parametrize("max_tokens", [0, 4])
def test_a_chunked_prompt_is_scored_as_one_forward_would(chunked_engine, reference, max_tokens):
    prompt = TEXTS[1] + TEXTS[0]
    ids = reference.encode(prompt)
    assert len(ids) > 5 * 16
    messages = run_job(chunked_engine, prompt, max_tokens=max_tokens, logprobs=2, n=2, ignore_eos=True)
    assert messages[-1]["type"] == protocol.DONE, messages[-1]
    generated = reference.greedy(ids, max_tokens, min_new_tokens=max_tokens) if max_tokens else []
    with torch.no_grad():
        logits = reference.model(torch.tensor([ids + generated])).logits[0]
    expected = torch.log_softmax(logits, dim=-1)
    token_text = TokenText(reference.tokenizer)
    for index in (0, 1):
        got = merged_logprobs(messages, index)
        assert len(got["tokens"]) == len(ids) + max_tokens
        assert got["tokens"][:len(ids)] == [token_text(t) for t in ids]
        assert got["text_offset"][:len(ids)] == [min(o, len(prompt)) for o in quadratic_offsets(reference.tokenizer, ids)]
        assert got["token_logprobs"][0] is None and got["top_logprobs"][0] is None
        for position in range(1, len(ids) + max_tokens):
            token = (ids + generated)[position]
            assert got["token_logprobs"][position] == pytest.approx(float(expected[position - 1, token]), abs=1e-4)
            values, indices = expected[position - 1].topk(2)
            top = {token_text(t): v for t, v in zip(indices.tolist(), values.tolist())}
            top.setdefault(token_text(token), float(expected[position - 1, token]))
            assert got["top_logprobs"][position] == pytest.approx(top, abs=1e-4)
    # The prompt's scores go out in one piece with the first token, as before chunking.
    with_logprobs = [m for m in messages if any(c["logprobs"] and c["logprobs"]["tokens"] for c in m.get("choices", []))]
    first = next(c for c in with_logprobs[0]["choices"] if c["index"] == 0)
    assert len(first["logprobs"]["tokens"]) == len(ids) + (1 if max_tokens else 0)
