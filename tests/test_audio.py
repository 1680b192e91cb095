"""`/v1/audio/transcriptions` and `/translations` through the real server and the OpenAI SDK.

The text equals the model's own `generate` on the processor's features of each 30 s window of
the same samples (read here with the standard library's `wave`), in every response format.
"""
from __future__ import annotations


import httpx
import numpy as np
import pytest
import torch

from . import media_files
from .conftest import TINY_MODEL, TINY_WHISPER
from .helpers.errors import assert_openai_error
from .helpers.audio import RATE, WhisperReference, wav_samples

@pytest.fixture(scope="module")
def whisper(media_cache) -> WhisperReference:
    return WhisperReference(media_cache)


@pytest.fixture(scope="module")
def long_wav() -> bytes:
    """36 s: two windows."""
    return media_files.wav_bytes(np.concatenate([media_files.tone(31, 440), media_files.tone(5, 660)]))


def test_transcription_equals_generate_in_each_format(media_client, whisper, long_wav):
    windows = whisper.windows(wav_samples(long_wav))
    assert len(windows) == 2
    text = "".join(windows)
    create = media_client.audio.transcriptions.create
    assert create(model=TINY_WHISPER, file=("long.wav", long_wav, "audio/wav")).text == text
    assert create(model=TINY_WHISPER, file=("long.wav", long_wav), response_format="text") == text
    verbose = create(model=TINY_WHISPER, file=("long.wav", long_wav), response_format="verbose_json",
                     timestamp_granularities=["segment"])
    assert verbose.text == text and verbose.duration == 36.0 and verbose.language and verbose.task == "transcribe"
    assert [(s.start, s.end, s.text) for s in verbose.segments] == [(0.0, 30.0, windows[0]), (30.0, 36.0, windows[1])]
    srt = create(model=TINY_WHISPER, file=("long.wav", long_wav), response_format="srt")
    assert srt == (f"1\n00:00:00,000 --> 00:00:30,000\n{windows[0].strip()}\n\n"
                   f"2\n00:00:30,000 --> 00:00:36,000\n{windows[1].strip()}\n\n")
    vtt = create(model=TINY_WHISPER, file=("long.wav", long_wav), response_format="vtt")
    assert vtt == (f"WEBVTT\n\n00:00:00.000 --> 00:00:30.000\n{windows[0].strip()}\n\n"
                   f"00:00:30.000 --> 00:00:36.000\n{windows[1].strip()}\n\n")


def test_language_prompt_mp3_translation_and_stream(media_client, whisper, long_wav):
    samples = wav_samples(long_wav)
    prompt_ids = torch.tensor(whisper.processor.get_prompt_ids("Tones and more tones"))
    expected = "".join(whisper.windows(samples, language="fr", prompt_ids=prompt_ids))
    got = media_client.audio.transcriptions.create(model=TINY_WHISPER, file=("long.wav", long_wav), language="fr",
                                                   prompt="Tones and more tones", temperature=0)
    assert got.text == expected
    translated = media_client.audio.translations.create(model=TINY_WHISPER, file=("long.wav", long_wav))
    assert translated.text == "".join(whisper.windows(samples, task="translate"))
    mp3 = media_files.mp3_bytes(media_files.tone(3, 440))
    assert media_client.audio.transcriptions.create(model=TINY_WHISPER, file=("a.mp3", mp3)).text
    events = list(media_client.audio.transcriptions.create(model=TINY_WHISPER, file=("long.wav", long_wav),
                                                           stream=True))
    windows = whisper.windows(samples)
    assert [e.type for e in events] == ["transcript.text.delta"] * 2 + ["transcript.text.done"]
    assert [e.delta for e in events[:2]] == windows and events[2].text == "".join(windows)


def post_audio(server, data: bytes | None, path: str = "transcriptions", **fields) -> httpx.Response:
    files = {"file": ("upload.wav", data, "audio/wav")} if data is not None else None
    return httpx.post(f"{server.base_url}/v1/audio/{path}", headers=server.headers, timeout=60,
                      data={"model": TINY_WHISPER, **fields}, files=files)


def test_bad_audio_requests_are_openai_errors(media_server, media_client, whisper):
    wav = media_files.wav_bytes(media_files.tone(2, 440))
    assert_openai_error(post_audio(media_server, b"this is not audio"), 400, param="file", code="invalid_audio")
    assert_openai_error(post_audio(media_server, media_files.png_bytes(media_files.image(1))), 400, param="file")
    assert_openai_error(post_audio(media_server, None), 400, param="file")
    assert_openai_error(post_audio(media_server, wav, language="xx"), 400, param="language")
    assert_openai_error(post_audio(media_server, wav, language="english"), 400, param="language")
    assert_openai_error(post_audio(media_server, wav, response_format="mp4"), 400, param="response_format")
    assert_openai_error(post_audio(media_server, wav, **{"timestamp_granularities[]": "sentence",
                                                         "response_format": "verbose_json"}), 400,
                        param="timestamp_granularities")
    assert_openai_error(post_audio(media_server, wav, stream="true", response_format="srt"), 400, param="stream")
    assert_openai_error(post_audio(media_server, wav, colour="blue"), 400, param="colour")
    assert_openai_error(post_audio(media_server, wav, model=TINY_MODEL), 400, code="unsupported_modality")
    assert_openai_error(post_audio(media_server, wav, path="translations", language="en"), 400, param="language")
    too_big = media_files.wav_bytes(np.zeros(70 * RATE, dtype=np.float32))  # 2.2 MB > the 2 MiB default limit
    assert_openai_error(post_audio(media_server, too_big), 413)
    json_body = httpx.post(f"{media_server.base_url}/v1/audio/transcriptions", headers=media_server.headers,
                           json={"model": TINY_WHISPER}, timeout=60)
    assert_openai_error(json_body, 400)
    # A multipart body without its boundary is the endpoint's 400, not the HTTP parser's "malformed request"
    # (Twisted no longer parses form bodies before Django does).
    no_boundary = httpx.post(f"{media_server.base_url}/v1/audio/transcriptions", timeout=60, content=b"no parts here",
                             headers={**media_server.headers, "content-type": "multipart/form-data"})
    assert "boundary" in assert_openai_error(no_boundary, 400, code="invalid_multipart")["message"]
    # Still serving.
    assert media_client.audio.transcriptions.create(model=TINY_WHISPER, file=("a.wav", wav)).text == "".join(
        whisper.windows(wav_samples(wav)))
