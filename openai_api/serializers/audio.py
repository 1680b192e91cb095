"""`POST /v1/audio/transcriptions` and `/v1/audio/translations` requests (multipart, as OpenAI's).

The file goes to the worker as sent (it decodes it, 400 for what it cannot); only its size is
bounded here, by INFERENCE_MAX_REQUEST_BYTES on the whole body (413).
"""
from __future__ import annotations

import math

from django.http import QueryDict
from rest_framework import serializers

from protocol import AudioPrompt, JobParams, to_job_params

from .content import invalid
from .fields import RejectUnknownFieldsMixin

RESPONSE_FORMATS = ("json", "text", "srt", "verbose_json", "vtt")
LIST_FIELDS = ("timestamp_granularities", "include")


class TranslationRequestSerializer(RejectUnknownFieldsMixin, serializers.Serializer):
    file = serializers.FileField(allow_empty_file=False)
    model = serializers.CharField(max_length=512)
    prompt = serializers.CharField(required=False, allow_blank=True, max_length=4096, trim_whitespace=False)
    response_format = serializers.ChoiceField(RESPONSE_FORMATS, required=False, default="json")
    temperature = serializers.FloatField(required=False, default=0.0, min_value=0.0, max_value=1.0)

    task = "translate"

    def validate_temperature(self, value: float) -> float:
        if not math.isfinite(value):
            raise serializers.ValidationError("temperature must be a number in [0, 1].")
        return value

    def to_internal_value(self, data):
        """Multipart sends lists as repeated `name[]` fields (the OpenAI SDK's way)."""
        if isinstance(data, QueryDict):
            plain = {}
            for key in data:
                name = key[:-2] if key.endswith("[]") else key
                plain[name] = data.getlist(key) if name in LIST_FIELDS else data.get(key)
            data = plain
        return super().to_internal_value(data)

    def job_prompts(self) -> list[AudioPrompt]:
        data = self.validated_data
        return [{"audio": data["file"].read(), "task": self.task, "language": data.get("language") or None,
                 "prompt": data.get("prompt") or None}]

    def job_params(self) -> JobParams:
        return to_job_params(self.validated_data)


class TranscriptionRequestSerializer(TranslationRequestSerializer):
    language = serializers.RegexField(r"^[a-z]{2,3}$", required=False, allow_blank=True,
                                      error_messages={"invalid": "language must be an ISO-639-1 code such as en."})
    timestamp_granularities = serializers.ListField(child=serializers.ChoiceField(("segment", "word")),
                                                    required=False)
    stream = serializers.BooleanField(required=False, default=False)
    include = serializers.ListField(child=serializers.CharField(), required=False, max_length=0,
                                    error_messages={"max_length": "include is not supported (no logprobs)."})

    task = "transcribe"

    def job_prompts(self) -> list[AudioPrompt]:
        prompts = super().job_prompts()
        if "word" in (self.validated_data.get("timestamp_granularities") or ()):
            prompts[0]["word_timestamps"] = True
        return prompts

    def validate(self, attrs: dict) -> dict:
        granularities = attrs.get("timestamp_granularities") or []
        if granularities and attrs["response_format"] != "verbose_json":
            raise invalid("timestamp_granularities", "timestamp_granularities needs response_format verbose_json.")
        if attrs["stream"] and attrs["response_format"] not in ("json", "text"):
            raise invalid("stream", "stream needs response_format json or text.")
        return attrs
