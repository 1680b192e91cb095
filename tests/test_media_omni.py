"""An omni model (vision and audio encoders beside the text model) through the real server and the OpenAI SDK.

The model is the tiny Gemma 4 (`create_tiny_model --arch omni`), loaded as a hub Gemma 4 is: its video
processor needs torchvision, which this torch build lacks. Greedy output equals the model's own `generate`
on the inputs its processor (built here from its parts, as transformers loads them) makes from the same
pictures and samples: an image, an audio clip (`input_audio` and `audio_url`), a video with a sound track
(its frames as images, then its sound as audio). A model that lacks a modality still refuses it.
"""
from __future__ import annotations

import base64

import pytest
from transformers import AutoFeatureExtractor, AutoImageProcessor, AutoModelForMultimodalLM, AutoTokenizer

from . import media_files
from .conftest import TINY_OMNI, TINY_VLM
from .processor_reference import ProcessorReference
from .helpers.errors import assert_openai_error
from .helpers.media import post_chat, wav_samples

MAX_TOKENS = 12


@pytest.fixture(scope="module")
def omni(media_cache) -> ProcessorReference:
    from transformers import Gemma4Processor

    from workers.engine.models.processors import NoVideoProcessor, without_video

    where = dict(cache_dir=media_cache, local_files_only=True)
    tokenizer = AutoTokenizer.from_pretrained(TINY_OMNI, **where)
    processor = without_video(Gemma4Processor)(
        feature_extractor=AutoFeatureExtractor.from_pretrained(TINY_OMNI, **where),
        image_processor=AutoImageProcessor.from_pretrained(TINY_OMNI, backend="pil", **where),
        tokenizer=tokenizer, video_processor=NoVideoProcessor(), chat_template=tokenizer.chat_template)
    return ProcessorReference(TINY_OMNI, AutoModelForMultimodalLM, "image", media_cache, MAX_TOKENS, processor)


def chat_ids(client, content: list[dict], model: str = TINY_OMNI) -> list[int]:
    reply = client.chat.completions.create(model=model, max_tokens=MAX_TOKENS, temperature=0,
                                           messages=[{"role": "user", "content": content}],
                                           extra_body={"return_token_ids": True})
    return reply.choices[0].model_extra["token_ids"]


def text(words: str) -> dict:
    return {"type": "text", "text": words}


def test_image_audio_and_both_equal_generate(media_client, omni):
    picture = media_files.image(1)
    wav = media_files.wav_bytes(media_files.tone(1, 440))
    image_part = {"type": "image_url", "image_url": {"url": media_files.data_url("image/png",
                                                                                 media_files.png_bytes(picture))}}
    audio_part = {"type": "input_audio", "input_audio": {"data": base64.b64encode(wav).decode(), "format": "wav"}}
    audio_url = {"type": "audio_url", "audio_url": {"url": media_files.data_url("audio/wav", wav)}}
    seen = omni.greedy("What is this?", [("image", picture)])
    assert chat_ids(media_client, [image_part, text("What is this?")]) == seen
    heard = omni.greedy("What is this?", [("audio", wav_samples(wav))])
    assert heard != seen
    assert chat_ids(media_client, [audio_part, text("What is this?")]) == heard
    assert chat_ids(media_client, [audio_url, text("What is this?")]) == heard
    both = omni.greedy("What is this?", [("image", picture), ("audio", wav_samples(wav))])
    assert chat_ids(media_client, [image_part, audio_part, text("What is this?")]) == both


def test_a_videos_frames_and_sound_track_both_reach_the_model(media_client, omni):
    frames, sound = media_files.video_frames(16), media_files.tone(2, 520)
    video = media_files.lossless_video_bytes(frames, sound=sound)
    part = {"type": "video_url", "video_url": {"url": media_files.data_url("video/x-matroska", video)}}
    expected = omni.greedy("What happens?", [("image", frame) for frame in frames[::2]]  # 8 of 16 frames
                           + [("audio", media_files.decoded_samples(video))])
    assert expected != omni.greedy("What happens?", [("image", frame) for frame in frames[::2]])
    assert chat_ids(media_client, [part, text("What happens?")]) == expected
    bare = media_client.responses.create(  # the seed's Responses shape: content items bare in `input`
        model=TINY_OMNI, max_output_tokens=MAX_TOKENS, temperature=0,
        input=[part, {"type": "input_text", "text": "What happens?"}])
    assert bare.output_text == omni.decode(expected)


def test_a_model_without_ears_still_refuses_audio_and_sees_a_videos_frames(media_server, media_client):
    """The vision-language model beside it: audio is a 400; a video with sound is its frames alone."""
    wav = media_files.wav_bytes(media_files.tone(1, 440))
    refused = post_chat(media_server, [{"role": "user", "content": [
        {"type": "input_audio", "input_audio": {"data": base64.b64encode(wav).decode(), "format": "wav"}}]}],
        model=TINY_VLM)
    assert_openai_error(refused, 400, code="unsupported_modality", param="messages[0].content[0]")
    frames = media_files.video_frames(8)
    silent, loud = (media_files.lossless_video_bytes(frames, sound=sound) for sound in (None, media_files.tone(2, 520)))
    answers = [chat_ids(media_client, [{"type": "video_url", "video_url": {
        "url": media_files.data_url("video/x-matroska", video)}}, text("What happens?")], model=TINY_VLM)
        for video in (silent, loud)]
    assert answers[0] == answers[1]
