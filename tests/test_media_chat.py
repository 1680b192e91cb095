"""Images and video in chat and Responses, through the real server and the real clients.

Greedy output equals the model's own `generate` on the inputs its own processor makes from the
same pictures (`processor.apply_chat_template(..., tokenize=True)`); a video is its frames,
sampled evenly, taken as images. Bad media are OpenAI-shaped 400/413 and the server keeps serving.
"""
from __future__ import annotations

import asyncio
import base64
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest
from huggingface_hub import InferenceClient
from openai import AsyncOpenAI
from transformers import AutoModelForImageTextToText

from . import media_files
from .conftest import TINY_AUDIO_LM, TINY_MODEL, TINY_OMNI, TINY_VLM, TINY_WHISPER
from .processor_reference import ProcessorReference
from .helpers.errors import assert_openai_error

MAX_TOKENS = 12


@pytest.fixture(scope="module")
def vision(media_cache) -> ProcessorReference:
    return ProcessorReference(TINY_VLM, AutoModelForImageTextToText, "image", media_cache, MAX_TOKENS)


def image_message(text: str, *urls: str, kind: str = "image_url") -> list[dict]:
    parts = [{"type": kind, kind: {"url": url}} for url in urls]
    return [{"role": "user", "content": [*parts, {"type": "text", "text": text}]}]


def png_url(seed: int) -> str:
    return media_files.data_url("image/png", media_files.png_bytes(media_files.image(seed)))


def chat_ids(client, messages, model: str = TINY_VLM) -> list[int]:
    reply = client.chat.completions.create(model=model, messages=messages, max_tokens=MAX_TOKENS, temperature=0,
                                           extra_body={"return_token_ids": True})
    return reply.choices[0].model_extra["token_ids"]


def test_image_chat_equals_generate(media_client, vision):
    for seed in (1, 2):
        expected = vision.greedy("What is in this picture?", [media_files.image(seed)])
        assert chat_ids(media_client, image_message("What is in this picture?", png_url(seed))) == expected
    # Two pictures, and the answer depends on them.
    two = vision.greedy("Compare.", [media_files.image(1), media_files.image(2)])
    assert chat_ids(media_client, image_message("Compare.", png_url(1), png_url(2))) == two
    assert vision.greedy("Compare.", [media_files.image(2), media_files.image(1)]) != two


def test_image_chat_through_inference_client_and_streaming(media_server, vision):
    """The seeds' own huggingface_hub example, pointed at a data URL."""
    expected = vision.decode(vision.greedy("What's in this image?", [media_files.image(3)]))
    client = InferenceClient(media_server.base_url, api_key=media_server.key)
    messages = image_message("What's in this image?", png_url(3))
    result = client.chat_completion(messages, model=TINY_VLM, max_tokens=MAX_TOKENS, temperature=0)
    assert result.choices[0].message.content == expected
    stream = client.chat_completion(messages, model=TINY_VLM, max_tokens=MAX_TOKENS, temperature=0, stream=True)
    assert "".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices) == expected


def test_video_is_its_frames_sampled_evenly(media_client, vision):
    frames = media_files.video_frames(16)
    url = media_files.data_url("video/x-matroska", media_files.lossless_video_bytes(frames))
    expected = vision.greedy("What happens?", frames[::2])  # 8 of 16 frames: 0, 2, …, 14
    assert chat_ids(media_client, image_message("What happens?", url, kind="video_url")) == expected


def test_text_and_image_requests_batch_together(media_server, vision):
    requests = [("Hello there", None), ("Describe it.", 4), ("Tell me more", None), ("What colour?", 5)]
    expected = [vision.greedy(text, [media_files.image(seed)] if seed else []) for text, seed in requests]

    async def run() -> list[list[int]]:
        client = AsyncOpenAI(base_url=f"{media_server.base_url}/v1", api_key=media_server.key, max_retries=0)

        async def one(text, seed):
            messages = image_message(text, png_url(seed)) if seed else [{"role": "user", "content": text}]
            reply = await client.chat.completions.create(model=TINY_VLM, messages=messages, max_tokens=MAX_TOKENS,
                                                         temperature=0, extra_body={"return_token_ids": True})
            return reply.choices[0].model_extra["token_ids"]

        return await asyncio.gather(*(one(text, seed) for text, seed in requests))

    assert asyncio.run(run()) == expected


def test_responses_input_image_and_input_file(media_client, vision):
    expected = vision.decode(vision.greedy("What is shown?", [media_files.image(6)]))
    for part in ({"type": "input_image", "image_url": png_url(6)},
                 {"type": "input_file", "file_data": png_url(6), "filename": "picture.png"}):
        response = media_client.responses.create(
            model=TINY_VLM, max_output_tokens=MAX_TOKENS, temperature=0,
            input=[{"role": "user", "content": [part, {"type": "input_text", "text": "What is shown?"}]}])
        assert response.output_text == expected


# --- http(s) URLs: fetched by the worker within limits ----------------------------------------

class FileServer:
    """The tests' own file server on 127.0.0.1 (the media server may fetch from that host only)."""

    def __init__(self) -> None:
        png = media_files.png_bytes(media_files.image(7))
        routes = {"/image.png": (200, png), "/big.png": (200, b"\0" * 300_000), "/missing.png": (404, b"")}
        server_port = {}

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802 (http.server's name)
                if self.path == "/redirect":
                    self.send_response(302)
                    self.send_header("Location", f"http://localhost:{server_port['port']}/image.png")
                    self.end_headers()
                    return
                if self.path == "/slow.png":
                    time.sleep(4)
                status, body = routes.get(self.path, (404, b""))
                self.send_response(status)
                self.send_header("Content-Type", "image/png")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = server_port["port"] = self.httpd.server_address[1]
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def url(self, path: str, host: str = "127.0.0.1") -> str:
        return f"http://{host}:{self.port}{path}"


@pytest.fixture(scope="module")
def files():
    server = FileServer()
    yield server
    server.httpd.shutdown()


def test_fetched_image_equals_its_data_url(media_client, vision, files):
    expected = vision.greedy("Look.", [media_files.image(7)])
    assert chat_ids(media_client, image_message("Look.", files.url("/image.png"))) == expected


def post_chat(server, messages, model: str = TINY_VLM) -> httpx.Response:
    return httpx.post(f"{server.base_url}/v1/chat/completions", headers=server.headers, timeout=60,
                      json={"model": model, "messages": messages, "max_tokens": 4})


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def test_bad_media_are_openai_errors_and_the_server_keeps_serving(media_server, media_client, vision, files):
    part = "messages[0].content[0]"
    bad = [
        (image_message("x", "data:image/png;base64,!!not base64!!"), 400, "invalid_base64"),
        (image_message("x", "data:image/png;base64," + b64(b"not an image")), 400, "invalid_image"),
        (image_message("x", "data:video/mp4;base64," + b64(b"not a video"), kind="video_url"), 400, "invalid_video"),
        (image_message("x", files.url("/image.png", host="localhost")), 400, "media_url_not_allowed"),
        (image_message("x", files.url("/redirect")), 400, "media_url_not_allowed"),
        (image_message("x", files.url("/big.png")), 413, "media_too_large"),
        (image_message("x", files.url("/slow.png")), 400, "media_fetch_timeout"),
        (image_message("x", files.url("/missing.png")), 400, "media_fetch_failed"),
        ([{"role": "user", "content": [{"type": "input_audio",
                                        "input_audio": {"data": b64(media_files.wav_bytes(media_files.tone(1, 440))),
                                                        "format": "wav"}}]}], 400, "unsupported_modality"),
    ]
    for messages, status, code in bad:
        assert_openai_error(post_chat(media_server, messages), status, code=code, param=part)
    # A model without the modality says which one it lacks.
    text_only = post_chat(media_server, image_message("x", png_url(1)), model=TINY_MODEL)
    assert_openai_error(text_only, 400, code="unsupported_modality", param=part)
    assert "image" in text_only.json()["error"]["message"]
    assert_openai_error(post_chat(media_server, [{"role": "user", "content": "hi"}], model=TINY_WHISPER), 400,
                        code="unsupported_model")
    # Shapes the web side refuses before any job.
    for messages, param in [
        (image_message("x", "ftp://example.invalid/a.png"), f"{part}.image_url.url"),
        ([{"role": "user", "content": [{"type": "input_audio", "input_audio": {"data": "AAAA", "format": "ogg"}}]}],
         f"{part}.input_audio.format"),
        ([{"role": "system", "content": [{"type": "image_url", "image_url": {"url": png_url(1)}}]}], part),
    ]:
        assert_openai_error(post_chat(media_server, messages), 400, param=param)
    huge = "data:image/png;base64," + "A" * (2 * 1024 * 1024 + 10)
    assert_openai_error(post_chat(media_server, image_message("x", huge)), 413)
    assert chat_ids(media_client, image_message("Still there?", png_url(1))) == vision.greedy("Still there?",
                                                                                                [media_files.image(1)])


def test_models_list_their_modalities(media_client):
    listed = {model.id: model.model_extra["modalities"] for model in media_client.models.list()}
    assert listed == {TINY_MODEL: ["text"], TINY_VLM: ["text", "image", "video"], TINY_WHISPER: ["audio"],
                      TINY_AUDIO_LM: ["text", "audio"], TINY_OMNI: ["text", "image", "video", "audio"]}
    assert media_client.models.retrieve(TINY_VLM).model_extra["modalities"] == ["text", "image", "video"]
