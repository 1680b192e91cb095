"""Names and clients shared by tests/seed_options/ (the seeds' servers and clients)."""
from __future__ import annotations

import time

import httpx
import torch
from openai import OpenAI

from ..conftest import Reference


REMOTE = "local/tiny-remote"  # pinned, its own code trusted by the flag
UNTRUSTED = "local/tiny-remote-untrusted"  # the same repo, never trusted
SAVED_INT8 = "local/tiny-llama-int8"  # saved quantized by torchao (quantization_config in config.json)
UNANNOUNCED_INT8 = "local/tiny-llama-int8-no-config"  # the same weights, config.json without quantization_config
ONLOAD_INT8 = "local/tiny-llama-onload-int8"  # quantized on load (its config-file entry)
BNB = "local/tiny-llama-bnb"  # bitsandbytes asked on a CPU worker
BF16 = "local/tiny-llama-bf16"  # saved in bfloat16, loaded as saved (dtype: checkpoint)
FIRST_RUN = "local/tiny-long"  # what `serve` builds on a first run (create_tiny_model --size tiny-long)
PROMPT = "Once upon a time"


def sdk(server) -> OpenAI:
    return OpenAI(base_url=f"{server.base_url}/v1", api_key=server.key, max_retries=0, timeout=120)


def listed(server) -> dict[str, dict]:
    body = httpx.get(f"{server.base_url}/v1/models", headers=server.headers, timeout=30).json()
    return {model["id"]: model for model in body["data"]}


def wait_loaded(server, name: str, timeout: float = 90.0) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        model = listed(server).get(name, {})
        if model.get("status") == "loaded":
            return model
        time.sleep(0.3)
    raise AssertionError(f"{name} not loaded: {listed(server).get(name)}")


def greedy_text(model: torch.nn.Module, reference: Reference, tokens: int) -> str:
    prompt = reference.encode(PROMPT)
    with torch.no_grad():
        output = model.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                                max_new_tokens=tokens, do_sample=False, pad_token_id=reference.tokenizer.pad_token_id)
    return reference.decode(output[0, len(prompt):].tolist())


def complete(server, tokens: int = 8, **body) -> httpx.Response:
    return httpx.post(f"{server.base_url}/v1/completions", headers=server.headers, timeout=120,
                      json={"prompt": PROMPT, "max_tokens": tokens, "temperature": 0, **body})
