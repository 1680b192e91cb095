"""Media a job carries: read (data: URLs, bounded http(s) fetches), then decoded for a model's processor.

Plain Python + Pillow + PyAV + numpy; no Django, no torch. Every failure is a `MediaError`
carrying the HTTP status the client gets (400 for what cannot be read or decoded, 413 for
what is too large), so a bad upload never becomes a 500. Nothing is written to disk:
bytes stay in memory and PyAV reads them from a BytesIO.

Fetching refuses private, loopback, link-local and reserved addresses (the first URL and
every redirect alike, checked before connecting) unless the host is in `allow_hosts`, and then
connects to the very address it checked (the name kept in the Host header and as the TLS server
name): a DNS answer that changes between check and connection (DNS rebinding) reaches nothing.
"""
from __future__ import annotations

import base64
import binascii
import io
import ipaddress
import socket
import time
from dataclasses import dataclass
from urllib.parse import urljoin, urlsplit

from workers.media.limits import MediaSettings

MAX_REDIRECTS = 3
MAX_IMAGE_PIXELS = 8192 * 8192
MAX_VIDEO_FRAMES_DECODED = 20_000
AUDIO_FORMATS = ("wav", "mp3")
CONTAINER_NAMES = {"wav": ("wav",), "mp3": ("mp3",)}


class MediaError(Exception):
    """Media that cannot be used; `status` is 400 (unreadable) or 413 (too large)."""

    def __init__(self, message: str, param: str | None, code: str, status: int = 400) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code


# --- reading -------------------------------------------------------------------------------

def decode_base64(data: str, param: str, max_bytes: int) -> bytes:
    if len(data) * 3 // 4 > max_bytes + 3:
        raise MediaError(f"{param}: the media is larger than the limit of {max_bytes} bytes.", param,
                         "media_too_large", 413)
    try:
        return base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        raise MediaError(f"{param}: the data is not valid base64.", param, "invalid_base64") from None


def parse_data_url(url: str, param: str, max_bytes: int) -> tuple[str, bytes]:
    """`data:<media type>[;base64],<data>` -> (media type, bytes); only base64 payloads are taken."""
    header, comma, payload = url.partition(",")
    if not comma or not header.startswith("data:") or not header.endswith(";base64"):
        raise MediaError(f"{param}: a data URL must look like data:<media type>;base64,<data>.", param,
                         "invalid_data_url")
    return header[5:-7].split(";")[0].lower(), decode_base64(payload, param, max_bytes)


def _public_address(host: str, port: int, allow_hosts: frozenset[str], param: str) -> str | None:
    """The address to connect to: refuse hosts that resolve to a non-public address (unless explicitly
    allowed, then None: connect by name)."""
    if host.lower() in allow_hosts:
        return None
    try:
        infos = socket.getaddrinfo(host, port, proto=socket.IPPROTO_TCP)
    except (socket.gaierror, UnicodeError):
        raise MediaError(f"{param}: the host {host!r} could not be resolved.", param, "media_fetch_failed") from None
    for info in infos:
        address = ipaddress.ip_address(info[4][0].split("%")[0])
        if not address.is_global or address.is_multicast:
            raise MediaError(f"{param}: URLs that point at private or local addresses are not fetched ({host}).",
                             param, "media_url_not_allowed")
    return infos[0][4][0].split("%")[0]


def _pinned(url: str, address: str | None) -> tuple[str, dict, dict]:
    """(URL to request, headers, request extensions): the checked address in place of the host name."""
    if address is None:
        return url, {}, {}
    parts = urlsplit(url)
    literal = f"[{address}]" if ":" in address else address
    netloc = literal + (f":{parts.port}" if parts.port else "")
    host_header = parts.hostname + (f":{parts.port}" if parts.port else "")
    extensions = {"sni_hostname": parts.hostname} if parts.scheme == "https" else {}
    return parts._replace(netloc=netloc).geturl(), {"Host": host_header}, extensions


def fetch_url(url: str, param: str, limits: MediaSettings) -> tuple[str, bytes]:
    """GET an http(s) URL within the limits: -> (media type from Content-Type, body)."""
    import httpx

    deadline = time.monotonic() + limits.fetch_timeout
    for _ in range(MAX_REDIRECTS + 1):
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise MediaError(f"{param}: only data:, http: and https: URLs are supported.", param, "invalid_url")
        address = _public_address(parts.hostname, parts.port or (443 if parts.scheme == "https" else 80),
                                  limits.allow_hosts, param)
        target, headers, extensions = _pinned(url, address)
        try:
            with httpx.Client(timeout=limits.fetch_timeout, follow_redirects=False, trust_env=False) as client:
                with client.stream("GET", target, headers=headers, extensions=extensions) as response:
                    if response.is_redirect and "location" in response.headers:
                        url = urljoin(url, response.headers["location"])
                        continue
                    if response.status_code != 200:
                        raise MediaError(f"{param}: fetching the URL returned HTTP {response.status_code}.", param,
                                         "media_fetch_failed")
                    return response.headers.get("content-type", "").split(";")[0].strip().lower(), \
                        _read_body(response, param, limits, deadline)
        except httpx.TimeoutException:
            raise MediaError(f"{param}: fetching the URL took longer than {limits.fetch_timeout:g} s.", param,
                             "media_fetch_timeout") from None
        except httpx.HTTPError as exc:
            raise MediaError(f"{param}: the URL could not be fetched ({type(exc).__name__}).", param,
                             "media_fetch_failed") from None
    raise MediaError(f"{param}: more than {MAX_REDIRECTS} redirects.", param, "media_fetch_failed")


def _read_body(response, param: str, limits: MediaSettings, deadline: float) -> bytes:
    too_large = MediaError(f"{param}: the fetched media is larger than the limit of {limits.max_bytes} bytes.",
                           param, "media_too_large", 413)
    declared = response.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limits.max_bytes:
        raise too_large
    body = bytearray()
    for chunk in response.iter_bytes():
        body += chunk
        if len(body) > limits.max_bytes:
            raise too_large
        if time.monotonic() > deadline:
            raise MediaError(f"{param}: fetching the URL took longer than {limits.fetch_timeout:g} s.", param,
                             "media_fetch_timeout")
    return bytes(body)


def read_url(url: str, param: str, limits: MediaSettings) -> tuple[str, bytes]:
    """A data: URL decoded, or an http(s) URL fetched: -> (media type, bytes)."""
    if url.startswith("data:"):
        return parse_data_url(url, param, limits.max_bytes)
    return fetch_url(url, param, limits)


# --- decoding ------------------------------------------------------------------------------

def decode_image(data: bytes, param: str):
    """Bytes of any format Pillow reads -> an RGB PIL image."""
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(io.BytesIO(data)) as image:
            if image.width * image.height > MAX_IMAGE_PIXELS:
                raise MediaError(f"{param}: the image has more than {MAX_IMAGE_PIXELS} pixels.", param,
                                 "image_too_large", 413)
            return image.convert("RGB")
    except (UnidentifiedImageError, OSError, ValueError, Image.DecompressionBombError, SyntaxError):
        raise MediaError(f"{param}: the image could not be decoded.", param, "invalid_image") from None


def _open_container(data: bytes, param: str, code: str):
    import av

    try:
        return av.open(io.BytesIO(data), mode="r")
    except (av.FFmpegError, ValueError, OSError):
        raise MediaError(f"{param}: the file could not be decoded.", param, code) from None


def decode_audio(data: bytes, param: str, sampling_rate: int, audio_format: str | None = None):
    """Bytes of audio (wav, mp3, or anything FFmpeg reads when no format is named) -> mono float32 at the rate."""
    import av
    import numpy as np

    if audio_format is not None and audio_format not in AUDIO_FORMATS:
        raise MediaError(f"{param}: audio format {audio_format!r} is not supported; use one of "
                         f"{', '.join(AUDIO_FORMATS)}.", param, "unsupported_audio_format")
    container = _open_container(data, param, "invalid_audio")
    with container:
        if audio_format is not None and not set(container.format.name.split(",")) & set(CONTAINER_NAMES[audio_format]):
            raise MediaError(f"{param}: the data is not {audio_format} audio.", param, "invalid_audio")
        if not container.streams.audio:
            raise MediaError(f"{param}: the file holds no audio.", param, "invalid_audio")
        resampler = av.AudioResampler(format="flt", layout="mono", rate=sampling_rate)
        pieces = []
        try:
            for frame in container.decode(audio=0):
                pieces.extend(out.to_ndarray().reshape(-1) for out in resampler.resample(frame))
            pieces.extend(out.to_ndarray().reshape(-1) for out in resampler.resample(None))
        except (av.FFmpegError, ValueError):
            raise MediaError(f"{param}: the audio could not be decoded.", param, "invalid_audio") from None
    if not pieces:
        raise MediaError(f"{param}: the audio is empty.", param, "invalid_audio")
    return np.concatenate(pieces).astype(np.float32)


def frame_indices(total: int, count: int) -> list[int]:
    """`count` frames spread evenly over `total` (transformers' default video sampling)."""
    count = min(count, total)
    return [int(i * total / count) for i in range(count)]


@dataclass(frozen=True)
class VideoClip:
    frames: list  # RGB PIL images, in order
    indices: list[int]  # which of the video's frames they are
    total_frames: int
    fps: float | None  # the video's frame rate (None: its container does not say)


def decode_video(data: bytes, param: str, frames: int) -> list:
    """Bytes of a video -> `frames` RGB PIL images sampled evenly over the whole video."""
    return decode_video_clip(data, param, frames).frames


def decode_video_clip(data: bytes, param: str, frames: int) -> VideoClip:
    """Bytes of a video -> `frames` RGB PIL images sampled evenly over the whole video, with which frames they
    are and the video's frame rate (a model that reads time from them: Qwen2.5-VL, Qwen3-VL)."""
    import av

    def decoded(container):
        try:
            yield from container.decode(video=0)
        except (av.FFmpegError, ValueError):
            raise MediaError(f"{param}: the video could not be decoded.", param, "invalid_video") from None

    with _open_container(data, param, "invalid_video") as container:
        if not container.streams.video:
            raise MediaError(f"{param}: the file holds no video.", param, "invalid_video")
        stream = container.streams.video[0]
        rate = stream.average_rate or stream.guessed_rate
        total = 0
        for _ in decoded(container):
            total += 1
            if total > MAX_VIDEO_FRAMES_DECODED:
                raise MediaError(f"{param}: the video has more than {MAX_VIDEO_FRAMES_DECODED} frames.", param,
                                 "video_too_long", 413)
    if total == 0:
        raise MediaError(f"{param}: the video has no frames.", param, "invalid_video")
    indices = frame_indices(total, frames)
    wanted = set(indices)
    with _open_container(data, param, "invalid_video") as container:
        images = [frame.to_image().convert("RGB") for index, frame in enumerate(decoded(container)) if index in wanted]
    return VideoClip(images, indices, total, float(rate) if rate else None)
