"""M-RoPE vision-language models (Qwen2-VL, Qwen2.5-VL, Qwen3-VL) through the real server.

Their text after a picture or a video sits at `index + offset` on three rotary axes, an offset of each prompt's
own; the engine keeps it per row (workers/engine/execution/mrope.py). Greedy output equals the model's own
`generate` on what its processor makes of the same picture or video (a video's frames paired in time, with
Qwen2.5-VL's seconds per grid and Qwen3-VL's timestamps: workers/engine/models/video_frames.py), for prompts with
media batched beside text-only ones (whose offset is 0) and prefilled in 24-token chunks, and for a
conversation's second turn from the prefix cache.
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


def user_message(text: str, seed: int | None, video: bool = False) -> dict:
    if seed is None:
        return {"role": "user", "content": text}
    if video:
        part = {"type": "video_url", "video_url": {"url": media_files.data_url(
            "video/x-matroska", media_files.lossless_video_bytes(video_frames(seed), fps=VIDEO_FPS))}}
    else:
        part = {"type": "image_url", "image_url": {"url": png_url(seed)}}
    return {"role": "user", "content": [part, {"type": "text", "text": text}]}


VIDEO_FPS = 4


def video_frames(seed: int) -> list:
    """A 4-frame video (the server takes every frame of so short a one)."""
    return [media_files.image(seed * 10 + frame) for frame in range(4)]


def video_inputs(ref: ProcessorReference, messages: list[dict], seed: int) -> dict:
    """What the processor makes of a conversation about `video_frames(seed)`, told which frames they are."""
    from transformers.video_utils import VideoMetadata

    text = ref.processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    frames = video_frames(seed)
    metadata = VideoMetadata(total_num_frames=len(frames), fps=float(VIDEO_FPS),
                             frames_indices=list(range(len(frames))), width=frames[0].width, height=frames[0].height)
    return dict(ref.processor(text=[text], videos=[frames], video_metadata=[metadata], do_sample_frames=False,
                              return_tensors="pt"))


def greedy_on(ref: ProcessorReference, inputs: dict) -> list[int]:
    import torch

    with torch.no_grad():
        output = ref.model.generate(**inputs, max_new_tokens=MAX_TOKENS, do_sample=False,
                                    pad_token_id=ref.processor.tokenizer.pad_token_id)
    return output[0, inputs["input_ids"].shape[1]:].tolist()


def video_question(text: str) -> list[dict]:
    return [{"role": "user", "content": [{"type": "video"}, {"type": "text", "text": text}]}]


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


@pytest.mark.parametrize("kind", QWEN_VL_KINDS)
def test_videos_batched_beside_pictures_and_text_give_what_generate_gives(qwen_server, qwen_cache, kind):
    """A video is one video to the model (not frames as pictures): its grid's positions, its seconds."""
    model = MODELS[kind]
    ref = reference(qwen_cache, model)
    question = "What happens in this video, from the start to the end of it?"
    expected = [greedy_on(ref, video_inputs(ref, video_question(question), 1)),
                ref.greedy("Hello there", []), ref.greedy("What colour is it?", [media_files.image(5)]),
                ref.greedy("Tell me a long story about a dragon who lived in the mountains.", [])]
    assert expected[0] != greedy_on(ref, video_inputs(ref, video_question(question), 2))  # the video matters
    got = asyncio.run(replies(qwen_server, model, [
        [user_message(question, 1, video=True)], [user_message("Hello there", None)],
        [user_message("What colour is it?", 5)],
        [user_message("Tell me a long story about a dragon who lived in the mountains.", None)]]))
    assert got == expected
    assert f"{model}: its processor" in qwen_server.log() and "stand-in for its video processor" in qwen_server.log()


@pytest.mark.parametrize("kind", QWEN_VL_KINDS)
def test_a_second_turn_about_the_same_video_starts_from_the_prefix_cache(qwen_server, qwen_cache, kind):
    from openai import OpenAI

    model = MODELS[kind]
    ref = reference(qwen_cache, model)
    client = OpenAI(base_url=f"{qwen_server.base_url}/v1", api_key=qwen_server.key, max_retries=0, timeout=120)
    question = "What is in this video? Say what you see in it, the colours, the shapes and where they go."
    first = [user_message(question, 3, video=True)]
    answer = client.chat.completions.create(model=model, messages=first, max_tokens=MAX_TOKENS,
                                            temperature=0).choices[0].message.content
    second = [*first, {"role": "assistant", "content": answer}, user_message("And then?", None)]
    again = client.chat.completions.create(model=model, messages=second, max_tokens=MAX_TOKENS, temperature=0,
                                           extra_body={"return_token_ids": True})
    conversation = [*video_question(question), {"role": "assistant", "content": [{"type": "text", "text": answer}]},
                    {"role": "user", "content": [{"type": "text", "text": "And then?"}]}]
    expected = greedy_on(ref, video_inputs(ref, conversation, 3))
    assert again.choices[0].model_extra["token_ids"] == expected
    cached = again.usage.prompt_tokens_details.cached_tokens
    assert 24 < cached < again.usage.prompt_tokens  # past the video's tokens, short of the new text


def test_a_video_qwen3_vl_cannot_take_is_a_400_and_the_server_goes_on(qwen_server, qwen_cache):
    """One frame is less than Qwen3-VL's temporal patch (its own processor refuses it too): an OpenAI-shaped 400
    naming why, and the next request is answered."""
    import openai

    model = MODELS["qwen3_vl"]
    client = openai.OpenAI(base_url=f"{qwen_server.base_url}/v1", api_key=qwen_server.key, max_retries=0, timeout=60)
    one_frame = media_files.data_url("video/x-matroska", media_files.lossless_video_bytes(video_frames(4)[:1]))
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(model=model, max_tokens=4, messages=[{"role": "user", "content": [
            {"type": "video_url", "video_url": {"url": one_frame}}, {"type": "text", "text": "What happens?"}]}])
    assert refused.value.body["code"] == "invalid_media" and "at least 2 frames" in refused.value.body["message"]
    assert client.chat.completions.create(model=model, max_tokens=4, messages=[user_message("Hi", None)]).choices


def greedy_conversation(ref: ProcessorReference, messages: list[dict]) -> list[int]:
    """`generate` on a whole conversation (pictures as PIL images), as its processor renders it."""
    return greedy_on(ref, ref.processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=True,
                                                            return_dict=True, return_tensors="pt"))


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
