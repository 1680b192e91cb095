"""TGI's request body, for the API description (openai_api/tgi.py turns it into a completions request,
whose serializer validates every parameter)."""
from __future__ import annotations

from rest_framework import serializers

from .fields import StrictBooleanField, StrictCharField
from .openai_params import ObjectField


class TGIRequestSerializer(serializers.Serializer):
    inputs = StrictCharField(allow_blank=True)
    parameters = ObjectField(required=False, allow_null=True,
                             help_text="TGI's: max_new_tokens, temperature, top_p, top_k, do_sample, seed, stop, "
                                       "repetition_penalty, frequency_penalty, details, return_full_text, adapter_id")
    stream = StrictBooleanField(required=False, default=False)
