"""Issue 49's readiness measure, shared by tests/test_readiness.py and `bench --scenario readiness`: a fresh
process's first completion after `/health` said ok, against its second."""
from __future__ import annotations

import time

import httpx


def first_and_second(base_url: str, headers: dict[str, str], model: str) -> tuple[float, float]:
    """Seconds of the first and the second greedy 4-token completion, one after the other."""
    times = []
    for _ in range(2):
        started = time.monotonic()
        response = httpx.post(f"{base_url}/v1/completions", headers=headers, timeout=60,
                              json={"model": model, "prompt": "Once upon a time", "max_tokens": 4,
                                    "temperature": 0})
        times.append(time.monotonic() - started)
        assert response.status_code == 200, response.text
    return times[0], times[1]
