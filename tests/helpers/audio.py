"""The Whisper reference and WAV decoding the speech tests compare the server against."""
from __future__ import annotations

import io
import wave

import numpy as np
import torch
from transformers import AutoModelForSpeechSeq2Seq, AutoProcessor

from ..conftest import FROM_CACHE, TINY_WHISPER


RATE = 16000


WINDOW = 30 * RATE


def wav_samples(data: bytes) -> np.ndarray:
    with wave.open(io.BytesIO(data)) as handle:
        return np.frombuffer(handle.readframes(handle.getnframes()), dtype="<i2").astype(np.float32) / 32768


class WhisperReference:
    def __init__(self, cache) -> None:
        self.processor = AutoProcessor.from_pretrained(TINY_WHISPER, cache_dir=cache, local_files_only=True)
        self.model = AutoModelForSpeechSeq2Seq.from_pretrained(TINY_WHISPER, cache_dir=cache, **FROM_CACHE)
        self.model.eval()

    def windows(self, samples: np.ndarray, task: str = "transcribe", **kwargs) -> list[str]:
        texts = []
        for start in range(0, len(samples), WINDOW):
            features = self.processor(samples[start:start + WINDOW], sampling_rate=RATE, return_tensors="pt",
                                      return_attention_mask=True)
            with torch.no_grad():
                ids = self.model.generate(features.input_features, attention_mask=features.attention_mask,
                                          do_sample=False, task=task, **kwargs)[0]
            texts.append(self.processor.decode(ids, skip_special_tokens=True))
        return texts
