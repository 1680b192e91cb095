"""The seeds' options: CORS."""
from __future__ import annotations

import httpx


def test_cors_preflight_needs_no_key_and_answers_carry_the_headers(keyed):
    origin = "http://localhost:3000"
    preflight = httpx.options(f"{keyed.base_url}/v1/chat/completions", timeout=30, headers={
        "Origin": origin, "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "authorization,content-type,x-stainless-os"})
    assert preflight.status_code == 200
    assert preflight.headers["access-control-allow-origin"] == "*"
    assert "authorization" in preflight.headers["access-control-allow-headers"]
    models = httpx.get(f"{keyed.base_url}/v1/models", headers={**keyed.headers, "Origin": origin}, timeout=30)
    assert models.status_code == 200 and models.headers["access-control-allow-origin"] == "*"
    assert "x-request-id" in models.headers["access-control-expose-headers"]
    refused = httpx.get(f"{keyed.base_url}/v1/models", headers={"Origin": origin}, timeout=30)
    assert refused.status_code == 401  # CORS lets a page call; the key is still needed


def test_cors_is_off_unless_asked(open_server):
    preflight = httpx.options(f"{open_server.base_url}/v1/models", timeout=30, headers={
        "Origin": "http://evil.example", "Access-Control-Request-Method": "GET"})
    assert "access-control-allow-origin" not in preflight.headers
