"""Sizes in bytes as settings and flags spell them (vLLM's forms)."""
from __future__ import annotations

import re

BYTE_SIZE = re.compile(r"^(\d+(?:\.\d+)?)\s*([kKmMgGtT]?)(i?[bB])?$")
BYTE_UNITS = {"": 1, "k": 1000, "m": 1000**2, "g": 1000**3, "t": 1000**4}


def parse_bytes(text: str) -> int:
    """A size in bytes: 4294967296, 4G or 4GiB (1024-based), 4g or 4GB (1000-based), as vLLM's sizes read."""
    match = BYTE_SIZE.match(text.strip())
    if not match:
        raise ValueError(f"{text!r} is not a size in bytes (e.g. 8589934592, 8G, 8GiB, 512M)")
    number, unit, suffix = match.groups()
    binary = (suffix or "").lower() == "ib" or (unit.isupper() and not suffix)
    scale = 1024 ** "kmgt".index(unit.lower()) * 1024 if unit and binary else BYTE_UNITS[unit.lower()]
    return int(float(number) * scale)
