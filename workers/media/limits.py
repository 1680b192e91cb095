"""How much media a job may bring: the limits the decoders enforce (the engine's config carries one)."""
from __future__ import annotations

from dataclasses import dataclass

MIB = 1024 * 1024


@dataclass(frozen=True)
class MediaSettings:
    """Media in jobs: bytes one file may have, how long an http(s) fetch may take, hosts fetched even though
    they resolve to private or local addresses, and how many frames a video becomes."""

    max_bytes: int = 20 * MIB
    fetch_timeout: float = 10.0
    allow_hosts: frozenset[str] = frozenset()
    video_frames: int = 8
