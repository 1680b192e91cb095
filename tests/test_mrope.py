"""M-RoPE vision-language models (Qwen2-VL, Qwen2.5-VL, Qwen3-VL) through the real server.

Their text after a picture sits at `index + offset` on three rotary axes, an offset of each prompt's own; the
engine keeps it per row (workers/engine/execution/mrope.py). Greedy output equals the model's own `generate`
on what its processor makes of the same picture, for prompts with pictures batched beside text-only ones
(whose offset is 0) and prefilled in 24-token chunks, and for a conversation's second turn.
"""
from __future__ import annotations

import asyncio

import pytest
from openai import AsyncOpenAI
from transformers import AutoModelForImageTextToText

from workers.engine.models.processors import load_processor
from workers.tiny.qwen_vl import QWEN_VL_KINDS, build_tiny_qwen_vl

from . import media_files
from .live_server import LiveServer, base_env
from .processor_reference import ProcessorReference

MAX_TOKENS = 12
MODELS = {kind: f"local/tiny-{kind.replace('_', '-')}" for kind in QWEN_VL_KINDS}


@pytest.fixture(scope="module")
def qwen_cache(tmp_path_factory):
    cache = tmp_path_factory.mktemp("hf-qwen-vl-cache")
    for kind, repo_id in MODELS.items():
        build_tiny_qwen_vl(repo_id, kind, cache_dir=cache)
    return cache


@pytest.fixture(scope="module")
def qwen_server(qwen_cache, tmp_path_factory):
    work_dir = tmp_path_factory.mktemp("qwen-vl-server")
    # The static decode step forced on (eager on CPU): its first step runs over the window too and is used only
    # if both agree, so both forms of the (4, rows) positions are checked (the test asserts it was used).
    env = base_env(qwen_cache, work_dir, INFERENCE_PREFILL_CHUNK="24", INFERENCE_STATIC_DECODE="on",
                   INFERENCE_WORKER_ACK_TIMEOUT="60")
    live = LiveServer(env, work_dir, name="qwen-vl")
    yield live
    live.stop()


def reference(cache, repo_id: str) -> ProcessorReference:
    processor = load_processor(repo_id, cache_dir=cache, local_files_only=True)
    return ProcessorReference(repo_id, AutoModelForImageTextToText, "image", cache, MAX_TOKENS, processor=processor)


def png_url(seed: int) -> str:
    return media_files.data_url("image/png", media_files.png_bytes(media_files.image(seed)))


def user_message(text: str, seed: int | None) -> dict:
    if seed is None:
        return {"role": "user", "content": text}
    return {"role": "user", "content": [{"type": "image_url", "image_url": {"url": png_url(seed)}},
                                        {"type": "text", "text": text}]}


async def replies(server: LiveServer, model: str, conversations: list[list[dict]]) -> list[list[int]]:
    """Every conversation's greedy reply ids, the requests sent at once (one batch)."""
    client = AsyncOpenAI(base_url=f"{server.base_url}/v1", api_key=server.key, max_retries=0, timeout=120)

    async def one(messages):
        reply = await client.chat.completions.create(model=model, messages=messages, max_tokens=MAX_TOKENS,
                                                     temperature=0, extra_body={"return_token_ids": True})
        return reply.choices[0].model_extra["token_ids"]

    return await asyncio.gather(*(one(messages) for messages in conversations))


@pytest.mark.parametrize("kind", QWEN_VL_KINDS)
def test_pictures_batched_beside_text_give_what_generate_gives(qwen_server, qwen_cache, kind):
    model = MODELS[kind]
    ref = reference(qwen_cache, model)
    requests = [("Describe it in detail, please, as long as you can.", 4), ("Hello there", None),
                ("What colour is the thing in the middle of this picture?", 5),
                ("Tell me a long story about a dragon who lived in the mountains and slept on gold coins.", None)]
    expected = [ref.greedy(text, [media_files.image(seed)] if seed else []) for text, seed in requests]
    assert expected[0] != ref.greedy(requests[0][0], [media_files.image(5)])  # the picture matters
    got = asyncio.run(replies(qwen_server, model, [[user_message(text, seed)] for text, seed in requests]))
    assert got == expected
    assert f"{model}: decode steps run as one static program" in qwen_server.log()


def greedy_conversation(ref: ProcessorReference, messages: list[dict]) -> list[int]:
    """`generate` on a whole conversation (pictures as PIL images), as its processor renders it."""
    import torch

    inputs = ref.processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=True,
                                               return_tensors="pt")
    with torch.no_grad():
        output = ref.model.generate(**inputs, max_new_tokens=MAX_TOKENS, do_sample=False,
                                    pad_token_id=ref.processor.tokenizer.pad_token_id)
    return output[0, inputs["input_ids"].shape[1]:].tolist()


def test_a_second_turn_about_the_same_picture_starts_from_the_prefix_cache(qwen_server, qwen_cache):
    """The first turn's keys/values, picture included, are reused: only the new text is prefilled, at the
    positions the first turn's picture gave it, and the answer is generate's on the whole conversation."""
    from openai import OpenAI

    model = MODELS["qwen2_vl"]
    ref = reference(qwen_cache, model)
    client = OpenAI(base_url=f"{qwen_server.base_url}/v1", api_key=qwen_server.key, max_retries=0, timeout=120)
    question = "What is in this picture? Say what you see in it, the colours, the shapes and where they are."
    first = [user_message(question, 6)]
    reply = client.chat.completions.create(model=model, messages=first, max_tokens=MAX_TOKENS, temperature=0)
    answer = reply.choices[0].message.content
    second = [*first, {"role": "assistant", "content": answer}, user_message("And what else?", None)]
    again = client.chat.completions.create(model=model, messages=second, max_tokens=MAX_TOKENS, temperature=0,
                                           extra_body={"return_token_ids": True})
    picture = media_files.image(6)
    expected = greedy_conversation(ref, [
        {"role": "user", "content": [{"type": "image", "image": picture}, {"type": "text", "text": question}]},
        {"role": "assistant", "content": [{"type": "text", "text": answer}]},
        {"role": "user", "content": [{"type": "text", "text": "And what else?"}]}])
    assert again.choices[0].model_extra["token_ids"] == expected
    cached = again.usage.prompt_tokens_details.cached_tokens
    assert cached > 16 and cached < again.usage.prompt_tokens  # past the picture's tokens, short of the new text
    # Another picture at the same place shares no keys/values with the first
    other = client.chat.completions.create(model=model, messages=[user_message(question, 7)], max_tokens=1)
    assert other.usage.prompt_tokens_details.cached_tokens == 0


def test_choices_of_a_picture_prompt_share_its_prefill_and_its_offset(qwen_server, qwen_cache):
    model = MODELS["qwen2_5_vl"]
    expected = reference(qwen_cache, model).greedy("Describe it.", [media_files.image(8)])
    client = AsyncOpenAI(base_url=f"{qwen_server.base_url}/v1", api_key=qwen_server.key, max_retries=0, timeout=120)
    reply = asyncio.run(client.chat.completions.create(
        model=model, messages=[user_message("Describe it.", 8)], max_tokens=MAX_TOKENS, temperature=0, n=2,
        extra_body={"return_token_ids": True}))
    assert [choice.model_extra["token_ids"] for choice in reply.choices] == [expected, expected]
