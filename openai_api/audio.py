"""`POST /v1/audio/transcriptions` and `/v1/audio/translations`: OpenAI's Audio API over speech-to-text models.

The worker transcribes the upload in windows (workers.engine.tasks.transcription), one ChoiceDelta per
window; here they become the text, the segments (and words) of `verbose_json`, SRT or WebVTT cues, or the
`transcript.text.delta` / `transcript.text.done` events of a stream. Uploads stay in memory
(the body limit bounds them): nothing of a request is ever written to disk.
"""
from __future__ import annotations

import math
from collections.abc import AsyncIterator

from django.core.files.uploadhandler import MemoryFileUploadHandler
from django.http import HttpResponse
from rest_framework.parsers import FormParser, MultiPartParser
from rest_framework.response import Response

from protocol import ChoiceDelta

from .base import GenerationView, sse_response
from .generation import GenerationStream
from .serializers.audio import TranscriptionRequestSerializer, TranslationRequestSerializer

TEXT_FORMATS = {"text": "text/plain", "srt": "application/x-subrip", "vtt": "text/vtt"}


class InMemoryUploadHandler(MemoryFileUploadHandler):
    """Every upload in memory, whatever its size (Django would spill large ones to a temporary file)."""

    def handle_raw_input(self, input_data, META, content_length, boundary, encoding=None):
        self.activated = True


async def windows(stream: GenerationStream) -> list[ChoiceDelta]:
    """Every window's delta, in order (cancels the job if cut short)."""
    found: list[ChoiceDelta] = []
    try:
        async for event in stream.events():
            found.extend(event.get("choices", ()))
    finally:
        await stream.cancel()
    return found


def timestamp(seconds: float, separator: str) -> str:
    millis = round(seconds * 1000)
    hours, rest = divmod(millis, 3_600_000)
    minutes, rest = divmod(rest, 60_000)
    return f"{hours:02d}:{minutes:02d}:{rest // 1000:02d}{separator}{rest % 1000:03d}"


class Transcript:
    """One finished transcript in each of OpenAI's response formats."""

    def __init__(self, task: str, started: dict, parts: list[ChoiceDelta], temperature: float,
                 granularities: list[str] | tuple = ()) -> None:
        self.task = task
        self.granularities = granularities or ("segment",)
        self.words = [word for part in parts for word in part.get("words", ())]
        self.seconds = float(started.get("audio_seconds") or 0.0)
        self.language = started.get("language") or ""
        step = started.get("window_seconds") or 30
        self.text = "".join(part["text"] for part in parts)
        self.segments = [{"id": i, "seek": i * step * 100, "start": float(i * step),
                          "end": min(float((i + 1) * step), self.seconds), "text": part["text"],
                          "tokens": part["token_ids"], "temperature": temperature}
                         for i, part in enumerate(parts)]

    @property
    def usage(self) -> dict:
        return {"type": "duration", "seconds": math.ceil(self.seconds)}

    def body(self, response_format: str) -> dict | str:
        if response_format == "json":
            return {"text": self.text, "usage": self.usage}
        if response_format == "verbose_json":
            body = {"task": self.task, "language": self.language, "duration": self.seconds, "text": self.text}
            if "word" in self.granularities:
                body["words"] = self.words
            if "segment" in self.granularities:
                body["segments"] = self.segments
            return {**body, "usage": self.usage}
        if response_format == "srt":
            return "".join(f"{s['id'] + 1}\n{timestamp(s['start'], ',')} --> {timestamp(s['end'], ',')}\n"
                           f"{s['text'].strip()}\n\n" for s in self.segments)
        if response_format == "vtt":
            return "WEBVTT\n\n" + "".join(f"{timestamp(s['start'], '.')} --> {timestamp(s['end'], '.')}\n"
                                          f"{s['text'].strip()}\n\n" for s in self.segments)
        return self.text


async def transcript_events(stream: GenerationStream) -> AsyncIterator[dict]:
    """OpenAI's streamed transcript: a delta per window, then the whole text."""
    parts: list[ChoiceDelta] = []
    async for event in stream.events():
        for part in event.get("choices", ()):
            parts.append(part)
            yield {"type": "transcript.text.delta", "delta": part["text"]}
    transcript = Transcript("transcribe", stream.started, parts, 0.0)
    yield {"type": "transcript.text.done", "text": transcript.text, "usage": transcript.usage}


class TranslationsView(GenerationView):
    serializer_class = TranslationRequestSerializer
    parser_classes = [MultiPartParser, FormParser]
    id_prefix = "audio"

    def initial(self, request, *args, **kwargs):
        super().initial(request, *args, **kwargs)  # bodies over the limit are a 413 before parsing
        request._request.upload_handlers = [InMemoryUploadHandler(request._request)]

    async def respond(self, serializer, request_id: str, model: str, stream: GenerationStream):
        data = serializer.validated_data
        if data.get("stream"):
            return sse_response(transcript_events(stream), stream)
        transcript = Transcript(serializer.task, stream.started, await windows(stream), data["temperature"],
                                data.get("timestamp_granularities") or ())
        body = transcript.body(data["response_format"])
        if isinstance(body, str):
            return HttpResponse(body, content_type=f"{TEXT_FORMATS[data['response_format']]}; charset=utf-8")
        return Response(body)


class TranscriptionsView(TranslationsView):
    serializer_class = TranscriptionRequestSerializer
