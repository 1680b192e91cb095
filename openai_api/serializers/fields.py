"""Strict JSON fields: OpenAI rejects "5" where 5 is expected, and so do we."""
from __future__ import annotations

import copy
import math

from rest_framework import serializers


class StrictIntegerField(serializers.IntegerField):
    def to_internal_value(self, data):
        if isinstance(data, bool) or not isinstance(data, int):
            self.fail("invalid")
        return super().to_internal_value(data)


class StrictFloatField(serializers.FloatField):
    def to_internal_value(self, data):
        if isinstance(data, bool) or not isinstance(data, (int, float)) or not math.isfinite(data):
            self.fail("invalid")
        return super().to_internal_value(data)


class StrictBooleanField(serializers.BooleanField):
    default_error_messages = {"invalid": "Must be a boolean."}

    def to_internal_value(self, data):
        if not isinstance(data, bool):
            self.fail("invalid")
        return data


class StrictCharField(serializers.CharField):
    """Text is taken as sent: no whitespace trimming (a suffix of " END" keeps its space)."""

    default_error_messages = {"invalid": "Must be a string."}

    def __init__(self, **kwargs) -> None:
        kwargs.setdefault("trim_whitespace", False)
        super().__init__(**kwargs)

    def to_internal_value(self, data):
        if not isinstance(data, str):
            self.fail("invalid")
        return super().to_internal_value(data)


class StopField(serializers.Field):
    """`stop`: a string or a list of up to `max_items` non-empty strings; always a list inside."""

    def __init__(self, max_items: int = 16, **kwargs) -> None:
        self.max_items = max_items
        super().__init__(**kwargs)

    def to_internal_value(self, data):
        items = [data] if isinstance(data, str) else data
        if not isinstance(items, list) or not all(isinstance(item, str) for item in items):
            raise serializers.ValidationError("Must be a string or a list of strings.")
        if len(items) > self.max_items:
            raise serializers.ValidationError(f"At most {self.max_items} stop sequences are allowed.")
        if any(item == "" for item in items):
            raise serializers.ValidationError("Stop sequences must not be empty.")
        return items

    def to_representation(self, value):
        return value


class StringListField(serializers.Field):
    """A list of up to `max_items` non-empty strings (bad_words)."""

    def __init__(self, max_items: int = 64, max_chars: int = 256, **kwargs) -> None:
        self.max_items, self.max_chars = max_items, max_chars
        super().__init__(**kwargs)

    def to_internal_value(self, data):
        if not isinstance(data, list) or not all(isinstance(item, str) and item for item in data):
            raise serializers.ValidationError("Must be a list of non-empty strings.")
        if len(data) > self.max_items or any(len(item) > self.max_chars for item in data):
            raise serializers.ValidationError(f"At most {self.max_items} strings of {self.max_chars} characters each.")
        return data

    def to_representation(self, value):
        return value


class TokenSequencesField(serializers.Field):
    """A list of non-empty token-id lists (bad_words_ids); ids are checked against the vocabulary on the worker."""

    def __init__(self, max_items: int = 256, max_length: int = 64, **kwargs) -> None:
        self.max_items, self.max_length = max_items, max_length
        super().__init__(**kwargs)

    def to_internal_value(self, data):
        def is_ids(item) -> bool:
            return (isinstance(item, list) and 0 < len(item) <= self.max_length
                    and all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in item))

        if not isinstance(data, list) or len(data) > self.max_items or not all(is_ids(item) for item in data):
            raise serializers.ValidationError(f"Must be at most {self.max_items} lists of 1 to {self.max_length} "
                                              "non-negative token ids.")
        return data

    def to_representation(self, value):
        return value


class TokenIdsField(serializers.Field):
    """A list of up to `max_items` non-negative token ids (stop_token_ids, allowed_token_ids); the worker
    checks them against the vocabulary."""

    def __init__(self, max_items: int = 256, min_items: int = 0, **kwargs) -> None:
        self.max_items, self.min_items = max_items, min_items
        super().__init__(**kwargs)

    def to_internal_value(self, data):
        if not (isinstance(data, list) and self.min_items <= len(data) <= self.max_items
                and all(isinstance(t, int) and not isinstance(t, bool) and 0 <= t < 2**31 for t in data)):
            raise serializers.ValidationError(
                f"Must be a list of {self.min_items} to {self.max_items} non-negative token ids.")
        return data

    def to_representation(self, value):
        return value


class EarlyStoppingField(serializers.Field):
    """Hugging Face's early_stopping: true, false or "never"."""

    def to_internal_value(self, data):
        if data not in (True, False, "never") or isinstance(data, int) and not isinstance(data, bool):
            raise serializers.ValidationError('Must be true, false or "never".')
        return data

    def to_representation(self, value):
        return value


class LogitBiasField(serializers.Field):
    """`logit_bias`: {"token id": bias in [-100, 100]}."""

    def to_internal_value(self, data):
        if not isinstance(data, dict):
            raise serializers.ValidationError("Must be an object mapping token ids to biases.")
        if len(data) > 1024:
            raise serializers.ValidationError("At most 1024 biased tokens are allowed.")
        result: dict[str, float] = {}
        for key, value in data.items():
            # ASCII digits only: "²".isdigit() is true, and int("²") raises.
            if not (key.isascii() and key.isdigit() and len(key) <= 10):
                raise serializers.ValidationError(f"Invalid token id {key!r}: keys must be token ids.")
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not -100 <= value <= 100:
                raise serializers.ValidationError(f"Bias for token {key} must be a number in [-100, 100].")
            result[str(int(key))] = float(value)
        return result

    def to_representation(self, value):
        return value


class RejectUnknownFieldsMixin:
    """Unknown request fields are an error (OpenAI's message), never silently ignored.

    Also: DRF deep-copies every declared field for each serializer instance (for a chat request's 68
    fields, 0.7 ms, the largest part of its validation). Here they are deep-copied once per class, and
    each instance gets shallow copies of the leaf fields; fields that hold other fields (nested
    serializers, list and dict fields) or a mutable default are still deep-copied.
    """

    def get_fields(self):
        prototypes = type(self).__dict__.get("_field_prototypes")
        if prototypes is None:
            prototypes = super().get_fields()
            type(self)._field_prototypes = prototypes
        return {name: copy.deepcopy(field) if _needs_own_copy(field) else _shallow_copy(field)
                for name, field in prototypes.items()}

    def to_internal_value(self, data):
        if not isinstance(data, dict):
            raise serializers.ValidationError({"non_field_errors": ["The request body must be a JSON object."]})
        unknown = [key for key in data if key not in self.fields]
        if unknown:
            raise serializers.ValidationError(
                {unknown[0]: [f"Unrecognized request argument supplied: {unknown[0]}"]}
            )
        return super().to_internal_value(data)


def _shallow_copy(field: serializers.Field) -> serializers.Field:
    """`copy.copy`, without its pickle protocol round (3 times slower for a DRF field)."""
    twin = object.__new__(type(field))
    twin.__dict__.update(field.__dict__)
    return twin


def _needs_own_copy(field: serializers.Field) -> bool:
    """Whether a shallow copy would share state between requests: fields it holds, a mutable default."""
    return (isinstance(field, serializers.BaseSerializer) or hasattr(field, "child") or hasattr(field, "fields")
            or isinstance(getattr(field, "default", None), (list, dict, set)))


class StreamOptionsSerializer(RejectUnknownFieldsMixin, serializers.Serializer):
    include_usage = StrictBooleanField(required=False, default=False)
    continuous_usage_stats = StrictBooleanField(required=False, default=False,
                                                help_text="vLLM's: with include_usage, usage so far on every chunk")
    include_obfuscation = StrictBooleanField(required=False, default=False,
                                             help_text="Accepted and ignored: chunks are never padded.")
