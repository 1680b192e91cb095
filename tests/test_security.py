"""Safe defaults: a generated SECRET_KEY, private files, Host checks, frame and sniffing protection,
keys never in logs, structured logs with request ids, and a production recipe `check --deploy` passes."""
from __future__ import annotations

import json
import re
import stat
import subprocess
import sys

import httpx

from .conftest import TINY_MODEL
from .live_server import ROOT, LiveServer, base_env


def mode(path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def production_env() -> dict[str, str]:
    """The `export` lines of the production recipe (docs/operations.md), as KEY=VALUE pairs."""
    readme = (ROOT / "docs" / "operations.md").read_text()
    recipe = readme.split("## Production", 1)[1].split("```bash", 1)[1].split("```", 1)[0]
    pairs = {}
    for line in recipe.splitlines():
        if line.startswith("export "):
            for item in re.findall(r"(\w+)=(\S+)", line):
                pairs[item[0]] = item[1].strip("'\"")
    assert pairs, "no export lines in the README's production recipe"
    return pairs


def test_the_readme_production_recipe_passes_check_deploy(hf_cache, tmp_path):
    env = base_env(hf_cache, tmp_path, **production_env())
    env.pop("DATABASE_URL", None)
    result = subprocess.run([sys.executable, "manage.py", "check", "--deploy", "--fail-level", "WARNING"],
                            cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "no issues" in result.stdout


def test_defaults_keep_secrets_and_data_private(server):
    var = server.work_dir / "var"
    assert mode(var) == 0o700
    assert mode(var / "secret_key") == 0o600 and len((var / "secret_key").read_text().strip()) >= 50
    assert mode(var / "db.sqlite3") == 0o600
    assert mode(server.key_file) == 0o600
    assert server.key not in server.log()  # the bootstrap key goes to a terminal only, never into a log


def test_a_host_outside_allowed_hosts_is_400(server):
    response = httpx.get(f"{server.base_url}/v1/models", headers={**server.headers, "Host": "evil.example"})
    assert response.status_code == 400 and response.json()["error"]["code"] == "invalid_host"
    assert httpx.get(f"{server.base_url}/v1/models", headers={**server.headers, "Host": "localhost"}).status_code == 200


def test_html_pages_cannot_be_framed_or_sniffed(server):
    for path in ("/admin/login/", "/docs", "/docs/redoc"):
        response = httpx.get(server.base_url + path)
        assert response.status_code == 200, path
        assert response.headers["x-frame-options"] == "DENY"
        assert response.headers["x-content-type-options"] == "nosniff"
        assert "frame-ancestors 'none'" in response.headers.get("content-security-policy", "")
    assert httpx.get(f"{server.base_url}/v1/models", headers=server.headers).headers["x-content-type-options"] == "nosniff"


def test_request_ids_are_echoed_and_in_every_json_log_line(hf_cache, tmp_path):
    live = LiveServer(base_env(hf_cache, tmp_path, LOG_FORMAT="json", INFERENCE_WORKER_ACK_TIMEOUT="120"), tmp_path,
                      name="json-logs")
    try:
        response = httpx.post(f"{live.base_url}/v1/completions", headers={**live.headers, "X-Request-Id": "req-42"},
                              json={"model": TINY_MODEL, "prompt": "hi", "max_tokens": 2, "temperature": 9})
        assert response.status_code == 400 and response.headers["x-request-id"] == "req-42"
        served = httpx.post(f"{live.base_url}/v1/completions", headers={**live.headers, "X-Request-Id": "req-43"},
                            json={"model": TINY_MODEL, "prompt": "hi", "max_tokens": 2}, timeout=120)
        job_id = served.json()["id"]
        generated = httpx.get(f"{live.base_url}/v1/models", headers={**live.headers, "X-Request-Id": "bad id\x7f"})
        assert re.fullmatch(r"[0-9a-f]{32}", generated.headers["x-request-id"])
    finally:
        live.stop()
    records = [json.loads(line) for line in live.log().splitlines() if line.startswith("{")]
    assert records and all({"time", "level", "logger", "message", "request_id"} <= set(r) for r in records)
    mine = [r for r in records if r["request_id"] == "req-42"]
    assert len(mine) == 1 and "POST /v1/completions 400" in mine[0]["message"] and "invalid_value" in mine[0]["message"]
    served_lines = [r["message"] for r in records if r["request_id"] == "req-43"]
    assert any(job_id in line for line in served_lines) and any("POST /v1/completions 200" in line for line in served_lines)
    assert any(job_id in r["message"] and r["logger"].startswith("workers") for r in records)  # the worker's own line
