"""Strict JSON fields: OpenAI rejects "5" where 5 is expected, and so do we. Also the request
serializers' mixin: unknown fields refused, and fields bound only when a request uses them."""
from __future__ import annotations

import copy
import math
from functools import cached_property

from django.core.exceptions import ValidationError as DjangoValidationError
from rest_framework import serializers
from rest_framework.fields import SkipField, empty, get_error_detail
from rest_framework.utils.serializer_helpers import BindingDict


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


def pinned_model_or_required() -> str:
    """A request without `model` gets the pinned model (`serve MODEL`); without one, `model` is required."""
    from django.conf import settings

    pinned = settings.INFERENCE.models.pinned
    if not pinned:
        raise serializers.ValidationError("This field is required (this server pins no model).", code="required")
    return pinned


class ModelNameField(StrictCharField):
    """`model`: a catalog name or alias (optionally @revision); may be left out when the server pins a model."""

    def __init__(self, **kwargs) -> None:
        kwargs.setdefault("max_length", 512)
        super().__init__(required=False, default=pinned_model_or_required, **kwargs)


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

    Also cheap to build per request: DRF deep-copies and binds every declared field for each
    serializer instance, and validates each (a chat request has 68, most of them absent). Here the
    fields are deep-copied once per class (the prototypes); an instance copies and binds a field only
    when it is used (`LazyFields`), and a field absent from a JSON body whose default is a plain value
    (not required, no `validate_<name>`, no callable or mutable default) takes that default without
    being copied or run, as DRF would give it. What the request names is validated by DRF's own steps.
    `lazy_fields = False` is DRF's own way throughout (the tests compare the two), as it is for a class
    that builds its own fields (overrides `get_fields`).
    """

    lazy_fields = True

    @classmethod
    def field_prototypes(cls) -> dict[str, serializers.Field]:
        prototypes = cls.__dict__.get("_field_prototypes")
        if prototypes is None:  # the next get_fields in the class's line (DRF's deep copy of the declared ones)
            prototypes = cls._field_prototypes = super(RejectUnknownFieldsMixin, object.__new__(cls)).get_fields()
        return prototypes

    def get_fields(self):
        return {name: _own_copy(field) for name, field in self.field_prototypes().items()}

    @classmethod
    def _binds_lazily(cls) -> bool:
        """A class that builds its own fields (overrides `get_fields`) gets DRF's way."""
        return cls.lazy_fields and cls.get_fields is RejectUnknownFieldsMixin.get_fields

    @cached_property
    def fields(self):
        if not self._binds_lazily():
            return super().fields
        return LazyFields(self, self.field_prototypes())

    def to_internal_value(self, data):
        if not isinstance(data, dict):
            raise serializers.ValidationError({"non_field_errors": ["The request body must be a JSON object."]})
        lazily = self._binds_lazily()
        names = self.field_prototypes() if lazily else self.fields
        unknown = [key for key in data if key not in names]
        if unknown:
            raise serializers.ValidationError(
                {unknown[0]: [f"Unrecognized request argument supplied: {unknown[0]}"]}
            )
        if not lazily or type(data) is not dict or getattr(self.root, "partial", False):  # a form's QueryDict
            return super().to_internal_value(data)
        prototypes = names
        ret: dict = {}
        errors: dict = {}
        for name, prototype in prototypes.items():
            if prototype.read_only:
                continue
            if name not in data and _default_without_running(self, name, prototype):
                if prototype.default is not empty:
                    self.set_value(ret, (prototype.source or name).split("."), prototype.default)
                continue
            field = self.fields[name]  # DRF's steps (Serializer.to_internal_value) for this one field
            validate_method = getattr(self, "validate_" + name, None)
            try:
                value = field.run_validation(field.get_value(data))
                if validate_method is not None:
                    value = validate_method(value)
            except serializers.ValidationError as exc:
                errors[name] = exc.detail
            except DjangoValidationError as exc:
                errors[name] = get_error_detail(exc)
            except SkipField:
                pass
            else:
                self.set_value(ret, field.source_attrs, value)
        if errors:
            raise serializers.ValidationError(errors)
        return ret

    def _read_only_defaults(self):
        """DRF's, without binding every field to find the read-only ones (request serializers have none)."""
        if self._binds_lazily() and not any(field.read_only for field in self.field_prototypes().values()):
            return {}
        return super()._read_only_defaults()


class LazyFields(BindingDict):
    """A serializer's fields, each copied from its class's prototype and bound the first time it is used;
    iterating, `values()` and `items()` bind them all (as DRF's own `BindingDict` holds them)."""

    def __init__(self, serializer, prototypes: dict[str, serializers.Field]) -> None:
        super().__init__(serializer)
        self.prototypes = prototypes

    def __getitem__(self, key):
        field = self.fields.get(key)
        if field is None:
            self[key] = field = _own_copy(self.prototypes[key])
        return field

    def __setitem__(self, key, field):
        if key not in self.prototypes:
            self.prototypes = {**self.prototypes, key: field}
        super().__setitem__(key, field)

    def __delitem__(self, key):
        self.prototypes = {name: field for name, field in self.prototypes.items() if name != key}
        self.fields.pop(key, None)

    def __iter__(self):
        return iter(self.prototypes)

    def __len__(self):
        return len(self.prototypes)

    def __contains__(self, key):
        return key in self.prototypes


def _default_without_running(serializer, name: str, prototype: serializers.Field) -> bool:
    """An absent field whose value is its plain default (or nothing), exactly as DRF would find it."""
    default = prototype.default  # `empty` (a class, so callable) when it has none: then it is left out
    plain = default is empty or not (callable(default) or isinstance(default, (list, dict, set)))
    return (plain and not prototype.required and prototype.source != "*"
            and not hasattr(serializer, "validate_" + name))


def _own_copy(field: serializers.Field) -> serializers.Field:
    return copy.deepcopy(field) if _needs_own_copy(field) else _shallow_copy(field)


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
