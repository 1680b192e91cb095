"""A transcription or translation job: audio turned into text by a speech-to-text model (Whisper).

The audio is decoded once (PyAV, at the feature extractor's sampling rate) and cut into
windows of the extractor's `chunk_length` (30 s for Whisper). The engine advances a job by
one window per step, between the decode steps of the running text batch, so a long file never
stalls the streams beside it; each window's text goes out as one ChoiceDelta as soon as it is
ready. A window is exactly `model.generate(features, attention_mask=…, language=…, task=…)` on the
processor's features, so the output equals the model's own (with `return_token_timestamps=True`
where word timestamps are asked for: workers.media.word_timestamps).

A task kind (workers/engine/tasks/kinds.py): the engine advances its jobs one window a step and publishes
what each has (request_id, reply_channel, finished, take_deltas, usage, started_message; no sequences).
"""
from __future__ import annotations

import time

import torch

import protocol
from workers.engine.errors import JobError
from workers.media.decoding import MediaError, decode_audio
from workers.engine.models.model_loader import LoadedModel
from protocol import AudioPrompt, ChoiceDelta, JobParams, Started, SubmitMessage, Usage
from workers.media.word_timestamps import generate_with_token_timestamps, has_alignment_heads, words


def is_audio_prompt(prompt) -> bool:
    return isinstance(prompt, dict) and "audio" in prompt


class Transcription:
    def __init__(self, job: SubmitMessage, model: LoadedModel) -> None:
        self.request_id: str = job["request_id"]
        self.reply_channel: str = job["reply_channel"]
        self.model = model
        self.arrived = time.monotonic()
        self.sequences: list = []  # nothing for the batch: the engine advances it with `advance()`
        self.streamed, self.answered = True, False  # one message per audio window, as it is transcribed
        if model.kind != "speech":
            raise JobError(400, f"The model `{model.model_id}` does not take audio input "
                           f"(it takes: {', '.join(model.modalities) or 'nothing'}).", "model", "unsupported_modality")
        prompt: AudioPrompt = job["prompts"][0]
        params = JobParams.from_wire(job["params"])
        extractor = model.processor.feature_extractor
        self.rate = extractor.sampling_rate
        try:
            audio = decode_audio(prompt["audio"], "file", self.rate)
        except MediaError as exc:
            raise JobError(exc.status, exc.message, exc.param, exc.code) from None
        window = extractor.chunk_length * self.rate
        self.windows = [audio[start:start + window] for start in range(0, len(audio), window)]
        self.seconds = len(audio) / self.rate
        self.options = self._generate_options(prompt, params)
        self.word_timestamps = bool(prompt.get("word_timestamps"))
        if self.word_timestamps and not has_alignment_heads(model.model):
            raise JobError(400, f"The model `{model.model_id}` gives no word timestamps (its generation config names "
                           "no alignment_heads).", "timestamp_granularities", "unsupported_timestamp_granularity")
        self.language = self._language_name()
        self.done = 0
        self.pending: list[ChoiceDelta] = []
        self.completion_tokens = 0

    def _generate_options(self, prompt: AudioPrompt, params: JobParams) -> dict:
        config = self.model.model.generation_config
        options: dict = {"task": prompt["task"]}
        language = prompt.get("language")
        if language:
            if f"<|{language}|>" not in (getattr(config, "lang_to_id", None) or {}):
                raise JobError(400, f"The model `{self.model.model_id}` does not know the language {language!r} "
                               "(an ISO-639-1 code such as en).", "language", "unsupported_language")
            options["language"] = language
        if prompt.get("prompt"):
            try:
                ids = self.model.processor.get_prompt_ids(prompt["prompt"])
            except ValueError as exc:  # text that spells a special token
                raise JobError(400, f"The prompt cannot be used: {exc}", "prompt", "invalid_prompt") from None
            options["prompt_ids"] = torch.tensor(ids, device=self.model.device)
        if params.temperature:  # 0 or absent: greedy, as OpenAI's default
            options.update(do_sample=True, temperature=params.temperature)
        else:
            options["do_sample"] = False
        if params.seed is not None:
            torch.manual_seed(params.seed)
        return options

    def _features(self, window: int) -> dict:
        """The window's features and attention mask (as the ASR pipeline asks the extractor for them)."""
        inputs = self.model.processor(self.windows[window], sampling_rate=self.rate, return_tensors="pt",
                                      return_attention_mask=True)
        return {"input_features": inputs.input_features.to(self.model.device, dtype=self.model.model.dtype),
                "attention_mask": inputs.attention_mask.to(self.model.device)}

    def _language_name(self) -> str:
        """The language asked for, else the one the model detects in the first window (verbose_json's)."""
        from transformers.models.whisper.tokenization_whisper import LANGUAGES

        code = self.options.get("language")
        if code is None:
            if not getattr(self.model.model.generation_config, "lang_to_id", None):
                return "english"  # an English-only model
            token_id = int(self.model.model.detect_language(self._features(0)["input_features"])[0])
            code = self.model.tokenizer.convert_ids_to_tokens(token_id).strip("<|>")
        return LANGUAGES.get(code, code)

    @property
    def finished(self) -> bool:
        return self.done >= len(self.windows)

    def advance(self) -> None:
        """Transcribe the next window."""
        if self.finished:
            return
        window = self.done
        if self.word_timestamps:
            ids, timestamps = generate_with_token_timestamps(self.model.model, **self._features(window), **self.options)
        else:
            ids = self.model.model.generate(**self._features(window), **self.options)[0].tolist()
        self.done += 1
        self.completion_tokens += len(ids)
        text = self.model.processor.decode(ids, skip_special_tokens=True)
        delta: ChoiceDelta = {"index": 0, "text": text, "token_ids": ids, "logprobs": None,
                              "finish_reason": "stop" if self.finished else None}
        if self.word_timestamps:
            window_seconds = self.model.processor.feature_extractor.chunk_length
            delta["words"] = words(self.model.tokenizer, ids, timestamps, self.language, window * window_seconds)
        self.pending.append(delta)

    def take_deltas(self) -> list[ChoiceDelta]:
        """One delta per transcribed window, in order."""
        deltas, self.pending = self.pending, []
        return deltas

    def started_message(self) -> Started:
        return {"type": protocol.STARTED, "model": self.model.model_id, "prompt_tokens": [0], "prompt_token_ids": [[]],
                "max_model_len": self.model.max_model_len, "audio_seconds": self.seconds,
                "window_seconds": self.model.processor.feature_extractor.chunk_length, "language": self.language}

    def usage(self) -> Usage:
        return {"prompt_tokens": 0, "completion_tokens": self.completion_tokens}
