"""Message content parts of Chat Completions and Responses, in the one shape jobs carry.

Text parts join into a string (as vLLM) unless the message holds media; then the content
stays a list of `{"type": "text", "text"}` and media parts `{"type": "image" | "video" |
"audio", "url", "format"?}` (protocol.MediaPart). URLs are only checked for their
shape here: the worker reads them (data: decoded, http(s) fetched within limits), decodes
them and answers 400/413 for what it cannot use.
"""
from __future__ import annotations

import logging
import mimetypes

from rest_framework import serializers

TEXT_PART_TYPES = ("text", "input_text", "output_text")
# Content parts a Responses `input` may also hold bare, outside a message (transformers serve's examples):
# consecutive ones are one user message.
BARE_INPUT_PART_TYPES = ("input_text", "input_image", "input_audio", "input_file", "image_url", "video_url",
                         "audio_url")
AUDIO_FORMATS = ("wav", "mp3")
AUDIO_MEDIA_TYPES = {"audio/wav": "wav", "audio/x-wav": "wav", "audio/wave": "wav", "audio/vnd.wave": "wav",
                     "audio/mpeg": "mp3", "audio/mp3": "mp3"}
DETAILS = ("auto", "low", "high")
logger = logging.getLogger(__name__)


def invalid(path: str, message: str) -> serializers.ValidationError:
    return serializers.ValidationError({path: [message]})


def _url(value, path: str) -> str:
    if not isinstance(value, str) or not value.startswith(("data:", "http://", "https://")):
        raise invalid(path, "must be a data: URL (data:<media type>;base64,<data>) or an http(s) URL.")
    if value.startswith("data:") and ";base64," not in value.split(",", 1)[0] + ",":
        raise invalid(path, "a data URL must be base64: data:<media type>;base64,<data>.")
    return value


def _keys(part: dict, allowed: set[str], path: str) -> None:
    """Fields clients add to a part (`cache_control`, vendor keys) are ignored, as vLLM: a debug line says so."""
    unknown = sorted(set(part) - allowed)
    if unknown:
        logger.debug("%s: ignoring fields the server does not know: %s", path, ", ".join(unknown))


def _url_object(part: dict, key: str, path: str) -> str:
    """Chat's `{"type": key, key: {"url", "detail"?}}` (a bare URL string is taken too)."""
    _keys(part, {"type", key}, path)
    spec = part.get(key)
    if isinstance(spec, str):
        return _url(spec, f"{path}.{key}")
    if not isinstance(spec, dict):
        raise invalid(f"{path}.{key}", f'{key} must be {{"url": "..."}}.')
    _keys(spec, {"url", "detail"}, f"{path}.{key}")
    if spec.get("detail", "auto") not in DETAILS:
        raise invalid(f"{path}.{key}.detail", f"detail must be one of {', '.join(DETAILS)}.")
    return _url(spec.get("url"), f"{path}.{key}.url")


def _audio(part: dict, path: str) -> dict:
    _keys(part, {"type", "input_audio"}, path)
    spec = part.get("input_audio")
    if not isinstance(spec, dict) or not isinstance(spec.get("data"), str):
        raise invalid(f"{path}.input_audio", 'input_audio must be {"data": "<base64>", "format": "wav" | "mp3"}.')
    if spec.get("format") not in AUDIO_FORMATS:
        raise invalid(f"{path}.input_audio.format", f"format must be one of {', '.join(AUDIO_FORMATS)}.")
    return {"type": "audio", "url": f"data:audio/{spec['format']};base64,{spec['data']}", "format": spec["format"]}


def _file(part: dict, path: str) -> dict:
    """Responses' `input_file` with `file_data` (a data URL) or `file_url`: its media type says which kind."""
    _keys(part, {"type", "file_data", "file_url", "filename", "file_id"}, path)
    if part.get("file_id") is not None:
        raise invalid(f"{path}.file_id", "This server stores no files: send file_data or file_url instead.")
    if part.get("file_data") is not None:
        url = _url(part["file_data"], f"{path}.file_data")
        if not url.startswith("data:"):
            raise invalid(f"{path}.file_data", "file_data must be a data: URL.")
        media_type = url[5:].split(";", 1)[0].lower()
    elif part.get("file_url") is not None:
        url = _url(part["file_url"], f"{path}.file_url")
        media_type = mimetypes.guess_type(url.split("?", 1)[0])[0] or ""
    else:
        raise invalid(path, "input_file needs file_data or file_url.")
    if not media_type and isinstance(part.get("filename"), str):
        media_type = mimetypes.guess_type(part["filename"])[0] or ""
    kind = media_type.split("/", 1)[0]
    if kind == "audio" and media_type in AUDIO_MEDIA_TYPES:
        return {"type": "audio", "url": url, "format": AUDIO_MEDIA_TYPES[media_type]}
    if kind in ("image", "video"):
        return {"type": kind, "url": url}
    raise invalid(path, f"input_file of type {media_type or 'unknown'!r} is not supported: "
                        "images, videos, and wav or mp3 audio are.")


def content_part(part, path: str) -> dict:
    """One part of a message's content list, as jobs carry it."""
    kind = part.get("type") if isinstance(part, dict) else None
    if kind in TEXT_PART_TYPES and isinstance(part.get("text"), str):
        return {"type": "text", "text": part["text"]}
    if kind == "image_url":
        return {"type": "image", "url": _url_object(part, "image_url", path)}
    if kind == "video_url":
        return {"type": "video", "url": _url_object(part, "video_url", path)}
    if kind == "audio_url":  # transformers serve's extension: audio by URL (FFmpeg tells its format)
        return {"type": "audio", "url": _url_object(part, "audio_url", path)}
    if kind == "input_image":  # Responses: {"type", "image_url": "<url>", "detail"?}
        _keys(part, {"type", "image_url", "detail", "file_id"}, path)
        if part.get("file_id") is not None:
            raise invalid(f"{path}.file_id", "This server stores no files: send image_url instead.")
        return {"type": "image", "url": _url(part.get("image_url"), f"{path}.image_url")}
    if kind == "input_audio":
        return _audio(part, path)
    if kind == "input_file":
        return _file(part, path)
    if kind:
        raise invalid(path, f"content part type {kind!r} is not supported.")
    raise invalid(path, 'content parts must be {"type": "text", "text": "..."} or a media part.')


def message_content(content, path: str, allow_none: bool, allow_media: bool) -> str | list[dict] | None:
    """A string; text parts joined with newlines; or, where media is allowed and present, the list of parts."""
    if content is None:
        if allow_none:
            return None
        raise invalid(path, "content is required for this role.")
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise invalid(path, "content must be a string or a list of content parts.")
    parts = [content_part(part, f"{path}[{index}]") for index, part in enumerate(content)]
    media = [index for index, part in enumerate(parts) if part["type"] != "text"]
    if not media:
        return "\n".join(part["text"] for part in parts)
    if not allow_media:
        raise invalid(f"{path}[{media[0]}]", "only user messages may hold images, audio or video.")
    return parts


def media_kinds(messages: list[dict]) -> list[tuple[str, str]]:
    """(kind, error path) of every media part of cleaned messages, in order."""
    found = []
    for m, message in enumerate(messages):
        if isinstance(message.get("content"), list):
            found.extend((part["type"], f"messages[{m}].content[{p}]")
                         for p, part in enumerate(message["content"]) if part["type"] != "text")
    return found
