"""INFERENCE_STREAM_INTERVAL through the real server: a stream's tokens come in groups, with the same text,
token ids and logprobs as the non-streamed answer, and the first token still alone at once."""
from __future__ import annotations

import pytest
from openai import OpenAI

from .conftest import TINY_MODEL
from .live_server import LiveServer, base_env

INTERVAL = 4
TOKENS = 17


@pytest.fixture(scope="module")
def grouped_client(hf_cache, tmp_path_factory):
    work_dir = tmp_path_factory.mktemp("stream-interval")
    live = LiveServer(base_env(hf_cache, work_dir, INFERENCE_STREAM_INTERVAL=str(INTERVAL)), work_dir, name="grouped")
    yield OpenAI(base_url=f"{live.base_url}/v1", api_key=live.key, max_retries=0, timeout=120)
    live.stop()


def test_a_streamed_chat_comes_in_groups_equal_to_the_whole_answer(grouped_client):
    ask = dict(model=TINY_MODEL, messages=[{"role": "user", "content": "Tell me a story"}], max_tokens=TOKENS,
               temperature=0, logprobs=True, top_logprobs=2, extra_body={"ignore_eos": True})
    whole = grouped_client.chat.completions.create(**ask)
    chunks = [c for c in grouped_client.chat.completions.create(**ask, stream=True) if c.choices]
    with_tokens = [c for c in chunks if c.choices[0].logprobs and c.choices[0].logprobs.content]
    sizes = [len(c.choices[0].logprobs.content) for c in with_tokens]
    assert sizes[0] == 1 and sum(sizes) == TOKENS == whole.usage.completion_tokens
    # groups of at least INTERVAL tokens (the last one: what is left); a loaded machine may deliver two at once,
    # which the web side's stream then sends as one chunk
    assert all(size >= INTERVAL and size % INTERVAL == 0 for size in sizes[1:-1]) and 1 <= sizes[-1], sizes
    assert len(with_tokens) <= 1 + -(-(TOKENS - 1) // INTERVAL)
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == whole.choices[0].message.content
    streamed = [t for c in with_tokens for t in c.choices[0].logprobs.content]
    assert [t.token for t in streamed] == [t.token for t in whole.choices[0].logprobs.content]
    # the second request starts from the first's cached prompt and may run in a batch buffer of another size:
    # the same tokens, logprobs equal to float32's last bits
    assert [t.logprob for t in streamed] == pytest.approx([t.logprob for t in whole.choices[0].logprobs.content],
                                                          abs=1e-5)


def test_streamed_completions_token_ids_join_to_the_whole_answers(grouped_client):
    ask = dict(model=TINY_MODEL, prompt="Once upon a time", max_tokens=TOKENS, temperature=0,
               extra_body={"ignore_eos": True, "return_token_ids": True})
    whole = grouped_client.completions.create(**ask)
    chunks = list(grouped_client.completions.create(**ask, stream=True))
    ids = [i for c in chunks if c.choices for i in (getattr(c.choices[0], "token_ids", None) or [])]
    assert ids == whole.choices[0].token_ids and len(ids) == TOKENS
    assert len([c for c in chunks if c.choices and c.choices[0].text]) < TOKENS // 2
    assert "".join(c.choices[0].text for c in chunks if c.choices) == whole.choices[0].text
