"""Reading /metrics: the Prometheus text and one sample's value."""
from __future__ import annotations

import re

import httpx

from ..conftest import TINY_MODEL

MODEL_LABEL = f'model_name="{TINY_MODEL}"'


def scrape(server, headers=None) -> str:
    response = httpx.get(f"{server.base_url}/metrics", headers=headers or {}, timeout=30)
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/plain")
    return response.text


def value(text: str, name: str, labels: str = MODEL_LABEL) -> float:
    """A sample's value (0 when absent); `labels` must all appear in the sample's label set."""
    total = 0.0
    for line in text.splitlines():
        match = re.match(r"^([^{\s]+)(?:\{(.*)\})?\s+(\S+)$", line)
        if match and match.group(1) == name and all(part in (match.group(2) or "") for part in labels.split(";")):
            total += float(match.group(3))
    return total
