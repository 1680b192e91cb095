"""Audio in chat and Responses (`input_audio`, `input_file`), through the real server and the OpenAI SDK.

The model is the tiny Qwen2-Audio (`create_tiny_model --arch audio-chat`). Greedy output equals the
model's own `generate` on the inputs its own processor makes from the same samples
(`processor.apply_chat_template(..., tokenize=True, return_dict=True)`, the samples read here with
the standard library's `wave`), token for token; audio and text requests share one continuous batch;
bad audio is an OpenAI-shaped 400 and the server keeps serving.
"""
from __future__ import annotations

import asyncio
import base64

import numpy as np
import pytest
from openai import AsyncOpenAI
from transformers import AutoModelForMultimodalLM

from . import media_files
from .conftest import TINY_AUDIO_LM, TINY_MODEL
from .processor_reference import ProcessorReference
from .helpers.errors import assert_openai_error
from .helpers.media import post_chat, wav_samples

MAX_TOKENS = 12


@pytest.fixture(scope="module")
def audio_lm(media_cache) -> ProcessorReference:
    return ProcessorReference(TINY_AUDIO_LM, AutoModelForMultimodalLM, "audio", media_cache, MAX_TOKENS)


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def audio_message(text: str, *clips: tuple[bytes, str]) -> list[dict]:
    parts = [{"type": "input_audio", "input_audio": {"data": b64(data), "format": fmt}} for data, fmt in clips]
    return [{"role": "user", "content": [*parts, {"type": "text", "text": text}]}]


def chat_ids(client, messages, model: str = TINY_AUDIO_LM) -> list[int]:
    reply = client.chat.completions.create(model=model, messages=messages, max_tokens=MAX_TOKENS, temperature=0,
                                           extra_body={"return_token_ids": True})
    return reply.choices[0].model_extra["token_ids"]


def test_audio_chat_equals_generate(media_client, audio_lm):
    low, high = media_files.wav_bytes(media_files.tone(1, 440)), media_files.wav_bytes(media_files.tone(2, 660))
    expected = audio_lm.greedy("What is this sound?", [wav_samples(low)])
    assert chat_ids(media_client, audio_message("What is this sound?", (low, "wav"))) == expected
    # The answer depends on the audio, and two clips go in order.
    assert audio_lm.greedy("What is this sound?", [wav_samples(high)]) != expected
    two = audio_lm.greedy("Compare.", [wav_samples(low), wav_samples(high)])
    assert chat_ids(media_client, audio_message("Compare.", (low, "wav"), (high, "wav"))) == two
    assert audio_lm.greedy("Compare.", [wav_samples(high), wav_samples(low)]) != two
    mp3 = media_files.mp3_bytes(media_files.tone(1.5, 550))
    assert chat_ids(media_client, audio_message("And this?", (mp3, "mp3"))) == audio_lm.greedy(
        "And this?", [media_files.decoded_samples(mp3)])


def test_audio_chat_streams_the_same_text(media_client, audio_lm):
    wav = media_files.wav_bytes(media_files.tone(1, 300))
    expected = audio_lm.decode(audio_lm.greedy("Listen.", [wav_samples(wav)]))
    stream = media_client.chat.completions.create(model=TINY_AUDIO_LM, messages=audio_message("Listen.", (wav, "wav")),
                                                  max_tokens=MAX_TOKENS, temperature=0, stream=True)
    assert "".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices) == expected


def test_audio_and_text_requests_batch_together(media_server, audio_lm):
    requests = [("Hello there", None), ("What do you hear?", 440), ("Tell me more", None), ("Which note?", 880)]
    clips = {freq: media_files.wav_bytes(media_files.tone(1, freq)) for _, freq in requests if freq}
    expected = [audio_lm.greedy(text, [wav_samples(clips[freq])] if freq else []) for text, freq in requests]

    async def run() -> list[list[int]]:
        client = AsyncOpenAI(base_url=f"{media_server.base_url}/v1", api_key=media_server.key, max_retries=0)

        async def one(text, freq):
            messages = audio_message(text, (clips[freq], "wav")) if freq else [{"role": "user", "content": text}]
            reply = await client.chat.completions.create(model=TINY_AUDIO_LM, messages=messages,
                                                         max_tokens=MAX_TOKENS, temperature=0,
                                                         extra_body={"return_token_ids": True})
            return reply.choices[0].model_extra["token_ids"]

        return await asyncio.gather(*(one(text, freq) for text, freq in requests))

    assert asyncio.run(run()) == expected


def test_responses_input_audio_and_input_file(media_client, audio_lm):
    wav = media_files.wav_bytes(media_files.tone(1, 520))
    expected = audio_lm.decode(audio_lm.greedy("What is shown?", [wav_samples(wav)]))
    for part in ({"type": "input_audio", "input_audio": {"data": b64(wav), "format": "wav"}},
                 {"type": "input_file", "file_data": media_files.data_url("audio/wav", wav), "filename": "a.wav"}):
        response = media_client.responses.create(
            model=TINY_AUDIO_LM, max_output_tokens=MAX_TOKENS, temperature=0,
            input=[{"role": "user", "content": [part, {"type": "input_text", "text": "What is shown?"}]}])
        assert response.output_text == expected


def test_audio_url_and_responses_items_outside_a_message(media_client, audio_lm):
    """transformers serve's shapes: an `audio_url` part (here a data: URL), and Responses content items sent
    bare in `input` (one user message together), each answered as the same audio in OpenAI's shapes."""
    wav = media_files.wav_bytes(media_files.tone(1, 610))
    expected = audio_lm.decode(audio_lm.greedy("What is shown?", [wav_samples(wav)]))
    chat = media_client.chat.completions.create(
        model=TINY_AUDIO_LM, max_tokens=MAX_TOKENS, temperature=0,
        messages=[{"role": "user", "content": [
            {"type": "audio_url", "audio_url": {"url": media_files.data_url("audio/wav", wav)}},
            {"type": "text", "text": "What is shown?"}]}])
    assert chat.choices[0].message.content == expected
    bare = media_client.responses.create(
        model=TINY_AUDIO_LM, max_output_tokens=MAX_TOKENS, temperature=0,
        input=[{"type": "input_audio", "input_audio": {"data": b64(wav), "format": "wav"}},
               {"type": "input_text", "text": "What is shown?"}])
    assert bare.output_text == expected


def test_bad_audio_is_an_openai_error_and_the_server_keeps_serving(media_server, media_client, audio_lm):
    part = "messages[0].content[0]"
    wav = media_files.wav_bytes(media_files.tone(1, 440))
    mp3 = media_files.mp3_bytes(media_files.tone(1, 440))
    raw = [{"role": "user", "content": [{"type": "input_audio", "input_audio": {"data": "!!not base64!!",
                                                                                "format": "wav"}}]}]
    for messages, code in [
        (raw, "invalid_base64"),
        (audio_message("x", (b"RIFF but not really a wave file", "wav")), "invalid_audio"),
        (audio_message("x", (media_files.png_bytes(media_files.image(1)), "wav")), "invalid_audio"),
        (audio_message("x", (mp3, "wav")), "invalid_audio"),  # the data is not what the format says
        (audio_message("x", (media_files.wav_bytes(np.zeros(0, dtype=np.float32)), "wav")), "invalid_audio"),
        (audio_message("x", (media_files.wav_bytes(media_files.tone(0.05, 440)), "wav")), "audio_too_short"),
    ]:
        assert_openai_error(post_chat(media_server, messages), 400, code=code, param=part)
    text_only = post_chat(media_server, audio_message("x", (wav, "wav")), model=TINY_MODEL)
    assert_openai_error(text_only, 400, code="unsupported_modality", param=part)
    assert "audio" in text_only.json()["error"]["message"]
    image = [{"role": "user", "content": [{"type": "image_url", "image_url": {
        "url": media_files.data_url("image/png", media_files.png_bytes(media_files.image(1)))}}]}]
    assert_openai_error(post_chat(media_server, image), 400, code="unsupported_modality", param=part)
    assert chat_ids(media_client, audio_message("Still there?", (wav, "wav"))) == audio_lm.greedy(
        "Still there?", [wav_samples(wav)])
