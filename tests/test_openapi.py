"""The OpenAPI 3.1 schema at /openapi.json, its docs at /docs, and Schemathesis fuzzing every operation."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import httpx

OPERATIONS = {
    ("/v1/completions", "post"), ("/v1/chat/completions", "post"), ("/v1/responses", "post"),
    ("/tokenize", "post"), ("/detokenize", "post"), ("/v1/tokenize", "post"), ("/v1/detokenize", "post"), ("/load_model", "post"), ("/unload_model", "post"),
    ("/v1/models", "get"), ("/v1/models/{model_id}", "get"), ("/metrics", "get"), ("/v1/key", "get"),
    ("/v1/audio/transcriptions", "post"), ("/v1/embeddings", "post"), ("/v1/rerank", "post"), ("/rerank", "post"),
    ("/v2/rerank", "post"), ("/v1/score", "post"), ("/score", "post"),
    ("/generate", "post"), ("/generate_stream", "post"), ("/info", "get"), ("/v1/audio/translations", "post"),
    ("/v1/responses/{response_id}", "get"), ("/v1/responses/{response_id}", "delete"),
    ("/v1/responses/{response_id}/cancel", "post"), ("/v1/responses/{response_id}/input_items", "get"),
    ("/version", "get"), ("/tokenizer_info", "get"),
    ("/v1/files", "get"), ("/v1/files", "post"), ("/v1/files/{file_id}", "get"), ("/v1/files/{file_id}", "delete"),
    ("/v1/files/{file_id}/content", "get"), ("/v1/batches", "get"), ("/v1/batches", "post"),
    ("/v1/batches/{batch_id}", "get"), ("/v1/batches/{batch_id}/cancel", "post"),
}


def test_schema_describes_every_endpoint_from_the_serializers(server):
    schema = httpx.get(f"{server.base_url}/openapi.json").json()
    assert schema["openapi"].startswith("3.1")
    assert {(path, method) for path, item in schema["paths"].items() for method in item} == OPERATIONS
    completion = schema["components"]["schemas"]["CompletionRequestRequest"]["properties"]
    assert completion["temperature"]["maximum"] == 2 and completion["logprobs"]["minimum"] == 0
    assert "add_special_tokens" in completion and "prompt" in completion
    assert schema["components"]["securitySchemes"]["bearer"]["scheme"] == "bearer"
    upload = schema["paths"]["/v1/files"]["post"]["requestBody"]["content"]
    assert list(upload) == ["multipart/form-data"]
    assert schema["components"]["schemas"]["FileUploadRequest"]["properties"]["file"]["format"] == "binary"
    batch = schema["components"]["schemas"]["BatchObject"]["properties"]
    assert set(batch["request_counts"]["$ref"].split("/")[-1:]) == {"RequestCounts"} and "output_file_id" in batch
    content = schema["paths"]["/v1/files/{file_id}/content"]["get"]["responses"]["200"]["content"]
    assert list(content) == ["application/jsonl"]


def test_docs_are_served_with_local_assets(server):
    for path in ("/docs", "/docs/redoc"):
        page = httpx.get(server.base_url + path).text
        assert "/static/drf_spectacular_sidecar/" in page
        assert not re.search(r'(src|href)="(https?:)?//', page), "docs must not load assets from elsewhere"
    asset = httpx.get(f"{server.base_url}/static/drf_spectacular_sidecar/swagger-ui-dist/swagger-ui-bundle.js")
    assert asset.status_code == 200 and len(asset.content) > 100_000


def test_schemathesis_finds_no_server_error_and_no_response_off_the_schema(warm_server, tmp_path):
    """Bounded: a few examples per operation (the coverage phase's edge cases, 6 fuzzed), fixed seed."""
    server = warm_server
    st = Path(sys.executable).with_name("st")
    result = subprocess.run(
        [str(st), "run", f"{server.base_url}/openapi.json", "-H", f"Authorization: Bearer {server.key}",
         "--checks", "not_a_server_error,response_schema_conformance,content_type_conformance",
         "--phases", "coverage,fuzzing", "--max-examples", "6", "--workers", "1", "--seed", "1",
         "--generation-database", "none", "--request-timeout", "60", "--no-color",
         "--report", "junit", "--report-dir", str(tmp_path)],
        capture_output=True, text=True, timeout=600, cwd=tmp_path,
    )
    summary = result.stdout[-4000:]
    assert result.returncode == 0, summary
    assert f"Tested: {len(OPERATIONS)}" in summary and " failed" not in summary.split("SUMMARY")[-1], summary
    assert "Traceback" not in server.log()


def test_schema_generates_without_warnings(tmp_path):
    """A renamed view or serializer would silently drop out of the schema: warnings fail here."""
    result = subprocess.run([sys.executable, "manage.py", "spectacular", "--validate", "--fail-on-warn",
                             "--file", str(tmp_path / "schema.yaml")], cwd=Path(__file__).resolve().parent.parent,
                            capture_output=True, text=True, timeout=120,
                            env={**os.environ, "INFERENCE_VAR_DIR": str(tmp_path / "var")})
    assert result.returncode == 0, result.stdout + result.stderr
