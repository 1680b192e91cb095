"""The API's JSON parser: nesting depth is bounded before parsing, and strings must be valid Unicode.

`json.loads` recurses once per nesting level, so 100k `[` raise RecursionError (a 500), and it
accepts lone UTF-16 surrogates (`"\\ud800"`) that no tokenizer can encode. Both are a 400 here,
for every endpoint, before any serializer or worker sees the body.
"""
from __future__ import annotations

import json
import re

from django.conf import settings
from rest_framework.exceptions import ParseError
from rest_framework.parsers import JSONParser

from .errors import APIError

STRING_LITERAL = re.compile(rb'"(?:[^"\\]|\\.)*"', re.DOTALL)
BRACKETS = {ord("["): 1, ord("{"): 1, ord("]"): -1, ord("}"): -1}
NOT_BRACKETS = bytes(b for b in range(256) if b not in BRACKETS)


def nesting_exceeds(body: bytes, limit: int) -> bool:
    """Whether arrays and objects in a JSON text nest deeper than `limit` (brackets in strings don't count)."""
    depth = 0
    for byte in STRING_LITERAL.sub(b'""', body).translate(None, NOT_BRACKETS):
        depth += BRACKETS[byte]
        if depth > limit:
            return True
    return False


class LoneSurrogate(Exception):
    """Where the first string or key holding a lone surrogate is (`messages[0].content`; "" for the top level)."""

    def __init__(self, path: str) -> None:
        super().__init__(path)
        self.path = path


def check_unicode(value, path: str = "") -> None:
    """Raise LoneSurrogate for the first string or object key that is not valid Unicode."""
    if isinstance(value, str):
        if not (value.isascii() or _encodable(value)):
            raise LoneSurrogate(path)
    elif isinstance(value, dict):
        for key, item in value.items():
            if not _encodable(key):
                raise LoneSurrogate(path)  # the key itself cannot go into a message
            check_unicode(item, f"{path}.{key}" if path else key)
    elif isinstance(value, list):
        for index, item in enumerate(value):
            check_unicode(item, f"{path}[{index}]")


def _encodable(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


class BoundedJSONParser(JSONParser):
    """JSONParser with the depth bound and the Unicode check; errors are OpenAI-shaped 400s."""

    def parse(self, stream, media_type=None, parser_context=None):
        body = stream.read() if stream is not None else b""
        limit = settings.INFERENCE.api.max_json_depth
        if nesting_exceeds(body, limit):
            raise APIError(400, f"The JSON body nests deeper than {limit} levels.", None, "json_too_deep")
        try:
            data = json.loads(body.decode("utf-8"), parse_constant=_reject_constant)
        except UnicodeDecodeError:
            raise ParseError("The body is not valid UTF-8.") from None
        except (ValueError, RecursionError) as exc:
            raise ParseError(f"JSON parse error - {exc}") from None
        try:
            check_unicode(data)
        except LoneSurrogate as exc:
            where = f"{exc.path}: " if exc.path else ""
            raise APIError(400, f"{where}strings must be valid Unicode; this one holds a lone UTF-16 surrogate.",
                           exc.path or None, "invalid_unicode") from None
        return data


def _reject_constant(name: str):
    raise ValueError(f"{name} is not valid JSON")
