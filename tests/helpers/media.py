"""Audio chat requests for the multimodal tests."""
from __future__ import annotations

import io
import wave

import httpx
import numpy as np

from ..conftest import TINY_AUDIO_LM


def wav_samples(data: bytes) -> np.ndarray:
    with wave.open(io.BytesIO(data)) as handle:
        return np.frombuffer(handle.readframes(handle.getnframes()), dtype="<i2").astype(np.float32) / 32768


def post_chat(server, messages, model: str = TINY_AUDIO_LM) -> httpx.Response:
    return httpx.post(f"{server.base_url}/v1/chat/completions", headers=server.headers, timeout=60,
                      json={"model": model, "messages": messages, "max_tokens": 4})
