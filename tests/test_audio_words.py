"""Word timestamps on `/v1/audio/transcriptions`, and the transcript against transformers' ASR pipeline.

Word timestamps (`timestamp_granularities[]=word`, verbose_json `words`) are the model's own:
`model.generate(..., return_token_timestamps=True)` per 30 s window (DTW over the cross-attention of
the generation config's `alignment_heads`), grouped into words by the pipeline's own
`_collate_word_timestamps`, a token `i` spanning `token_timestamps[i-1]` to `token_timestamps[i]`.

The pipeline: `pipeline("automatic-speech-recognition")` gave a different text from `generate` (and so
from the server) on the same audio for two reasons:
1. Its own default generation config (`AutomaticSpeechRecognitionPipeline._default_generation_config`)
   adds `num_beams=5` (and `max_new_tokens=256`, unused here as the model sets `max_length`) wherever
   the model's generation config does not set them: a 5-beam search where the server is greedy
   (OpenAI's temperature 0). This one stays: the pipeline's default equals `generate(num_beams=5)`,
   and with `num_beams=1` its text equals the server's.
2. The server always names the task; the pipeline names none, and generate then takes the decoder
   prompt from the model's generation config. A hub Whisper's `forced_decoder_ids` put
   `<|transcribe|>` there; the tiny Whisper had neither those nor `task`, so the pipeline's prompt was
   `<|startoftranscript|><|lang|><|notimestamps|>`, no task token. The tiny Whisper's generation
   config now says `task="transcribe"`, as a hub checkpoint's prompt does.
For audio longer than 30 s they differ for a third reason: the pipeline (without `chunk_length_s`)
hands the whole log-mel to Whisper's sequential long-form decoding, which predicts timestamps and
moves each next window to the last timestamp; the server cuts fixed 30 s windows, one `generate` each.
"""
from __future__ import annotations

import httpx
import numpy as np
import pytest
import torch
from transformers import AutoModelForSpeechSeq2Seq, AutoProcessor, pipeline
from transformers.models.whisper.tokenization_whisper import _collate_word_timestamps

from . import media_files
from .conftest import FROM_CACHE, TINY_WHISPER
from .helpers.audio import RATE, WINDOW, WhisperReference, wav_samples
from .helpers.errors import assert_openai_error


class WordReference:
    """A model of its own: generate with return_token_timestamps switches the model to eager attention."""

    def __init__(self, cache) -> None:
        self.processor = AutoProcessor.from_pretrained(TINY_WHISPER, cache_dir=cache, local_files_only=True)
        self.model = AutoModelForSpeechSeq2Seq.from_pretrained(TINY_WHISPER, cache_dir=cache, **FROM_CACHE)
        self.model.eval()

    def windows(self, samples: np.ndarray, language: str) -> list[tuple[str, list[dict]]]:
        """(text, words) per window, words as the ASR pipeline collates them, offset by the window's start."""
        tokenizer, found = self.processor.tokenizer, []
        for start in range(0, len(samples), WINDOW):
            features = self.processor(samples[start:start + WINDOW], sampling_rate=RATE, return_tensors="pt",
                                      return_attention_mask=True)
            with torch.no_grad():
                output = self.model.generate(features.input_features, attention_mask=features.attention_mask,
                                             do_sample=False, task="transcribe", return_token_timestamps=True)
            ids, stamps = output["sequences"][0].tolist(), output["token_timestamps"][0].tolist()
            text_ids = [(i, token) for i, token in enumerate(ids) if token < tokenizer.eos_token_id]
            spans = [(stamps[i - 1] if i else 0.0, stamps[i]) for i, _ in text_ids]
            collated = _collate_word_timestamps(tokenizer, [token for _, token in text_ids], spans, language, False)
            offset = start / RATE
            found.append((self.processor.decode(ids, skip_special_tokens=True),
                          [{"word": w["text"].strip(), "start": round(offset + w["timestamp"][0], 2),
                            "end": round(offset + w["timestamp"][1], 2)} for w in collated if w["text"].strip()]))
        return found


@pytest.fixture(scope="module")
def word_reference(media_cache) -> WordReference:
    return WordReference(media_cache)


@pytest.fixture(scope="module")
def whisper(media_cache) -> WhisperReference:
    return WhisperReference(media_cache)


def test_word_timestamps_are_the_models_token_timestamps(media_client, word_reference, whisper):
    samples = np.concatenate([media_files.tone(31, 440), media_files.tone(5, 660)])  # two windows
    wav = media_files.wav_bytes(samples)
    create = media_client.audio.transcriptions.create
    both = create(model=TINY_WHISPER, file=("long.wav", wav), response_format="verbose_json",
                  timestamp_granularities=["word", "segment"])
    expected = word_reference.windows(wav_samples(wav), both.language)
    assert both.text == "".join(text for text, _ in expected)
    words = [{"word": w.word, "start": w.start, "end": w.end} for w in both.words]
    assert words == [word for _, window in expected for word in window]
    assert [s.text for s in both.segments] == [text for text, _ in expected]
    # The words are the text, in order, within the audio.
    assert "".join("".join(w["word"] for w in words).split()) == "".join(both.text.split())
    assert words and all(0 <= w["start"] <= w["end"] <= both.duration for w in words)
    assert [w["start"] for w in words] == sorted(w["start"] for w in words)
    assert any(w["start"] >= 30 for w in words)  # the second window's are offset by its start
    only_words = create(model=TINY_WHISPER, file=("long.wav", wav), response_format="verbose_json",
                        timestamp_granularities=["word"])
    assert only_words.words == both.words and only_words.segments is None
    # The model is left as it was: a plain transcription still equals plain generate.
    assert create(model=TINY_WHISPER, file=("long.wav", wav)).text == "".join(whisper.windows(wav_samples(wav)))


def test_word_granularity_needs_verbose_json(media_server):
    wav = media_files.wav_bytes(media_files.tone(2, 440))
    response = httpx.post(f"{media_server.base_url}/v1/audio/transcriptions", headers=media_server.headers,
                          timeout=60, data={"model": TINY_WHISPER, "timestamp_granularities[]": "word"},
                          files={"file": ("a.wav", wav, "audio/wav")})
    assert_openai_error(response, 400, param="timestamp_granularities")


def test_transcription_equals_the_asr_pipeline_when_greedy(media_client, whisper):
    samples = media_files.tone(4, 523)
    wav = media_files.wav_bytes(samples)
    read = wav_samples(wav)
    asr = pipeline("automatic-speech-recognition", model=whisper.model, tokenizer=whisper.processor.tokenizer,
                   feature_extractor=whisper.processor.feature_extractor)
    served = media_client.audio.transcriptions.create(model=TINY_WHISPER, file=("a.wav", wav)).text
    assert served == asr(read.copy(), generate_kwargs={"num_beams": 1})["text"]
    # The pipeline's default is a 5-beam search (its own default generation config), not greedy.
    features = whisper.processor(read, sampling_rate=RATE, return_tensors="pt", return_attention_mask=True)
    with torch.no_grad():
        beams = whisper.model.generate(features.input_features, attention_mask=features.attention_mask,
                                       do_sample=False, num_beams=5)[0]
    default = asr(read.copy())["text"]
    assert default == whisper.processor.decode(beams, skip_special_tokens=True)
    assert default != served
