from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
import os
import signal

import pytest
import torch
import openai
from openai import AsyncOpenAI, OpenAI
from transformers import AutoModelForCausalLM, AutoTokenizer

from workers.engine import cpu_share
from workers.tiny.builders import build_tiny_model

from .live_server import LiveServer, Zygote, base_env
from .services import RedisServer, require_binary

TINY_MODEL = "local/tiny-llama"

# A shell runs a command started with `&` with SIGINT ignored, and every process started from it inherits that: the
# servers' Twisted then leaves Ctrl-C alone and the graceful-stop tests' SIGINT does nothing. Servers started from
# here handle SIGINT as a foreground `manage.py serve` does.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

# In-process torch work (engines, runners, `generate` references) takes this worker's share of the cores: two
# xdist workers with two OpenMP threads each on two cores spin against each other (the engine tests ran 2.6x
# slower than with one thread each). The servers the tests start size their own threads (workers/engine/cpu_share.py,
# imported first: it reads torch's default count, the most an engine's governor gives itself, before this sets one).
cpu_share.DEFAULT_THREADS  # noqa: B018
torch.set_num_threads(max(1, (os.cpu_count() or 1) // int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))))

Zygote.in_test_session = True  # this session's servers fork from tests/zygote.py (bench runs start theirs fresh)

# The slowest files, slowest first (quiet cores, `pytest -n 2 --durations=0`, 2026-11-28): under `-n 2 --dist
# loadfile` each process takes the next file when it is free, so handing these out first lets both end together
# instead of one waiting on a long file handed out last. Every other file keeps its order after them.
SLOWEST_FILES = ("test_bench.py", "test_model_families.py", "test_type_matrix.py", "test_team_accounts.py", "test_speculative.py",
                 "test_soak_faults_scale_out.py", "test_teams_scale_out.py", "test_gguf.py", "test_tensor_parallel.py",
                 "browser/test_chat.py",
                 "test_speculative_constrained.py", "test_openapi.py", "test_reliability_web.py", "test_readiness.py",
                 "test_speculative_proposers.py", "test_fair_share.py")


def pytest_collection_modifyitems(config, items) -> None:
    rank = {name: index for index, name in enumerate(SLOWEST_FILES)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::")[0].removeprefix("tests/"), len(rank)))

# A model from the cache alone: transformers passes `local_files_only` on to everything but its look for
# a PEFT adapter config, which asks the hub (23 s of retries with no network).
FROM_CACHE = {"local_files_only": True, "adapter_kwargs": {"local_files_only": True}}


@pytest.fixture(scope="session")
def hf_cache(tmp_path_factory) -> Path:
    cache = tmp_path_factory.mktemp("hf-cache")
    build_tiny_model(TINY_MODEL, size="tiny", cache_dir=cache)
    return cache


@pytest.fixture(scope="session")
def server(hf_cache, tmp_path_factory):
    work_dir = tmp_path_factory.mktemp("server")
    live = LiveServer(base_env(hf_cache, work_dir), work_dir)
    yield live
    live.stop()


@pytest.fixture(scope="session")
def client(server) -> OpenAI:
    return OpenAI(base_url=f"{server.base_url}/v1", api_key=server.key, max_retries=0, timeout=120)


@pytest.fixture(scope="session")
def warm_server(server, client):
    """The server after one job: the worker has imported torch and loaded the model (on a busy
    machine that first start can outlast INFERENCE_WORKER_ACK_TIMEOUT and answer 503)."""
    for _ in range(3):
        try:
            client.completions.create(model=TINY_MODEL, prompt="warm", max_tokens=1)
            break
        except openai.APIStatusError:
            continue
    return server


@pytest.fixture
def async_client(server) -> AsyncOpenAI:
    """Per test: its connection pool belongs to the event loop of the test's asyncio.run."""
    return AsyncOpenAI(base_url=f"{server.base_url}/v1", api_key=server.key, max_retries=0, timeout=120)


class Reference:
    """The same model loaded straight from the cache, for `model.generate` ground truth."""

    def __init__(self, cache: Path, model_id: str = TINY_MODEL) -> None:
        self.tokenizer = AutoTokenizer.from_pretrained(model_id, cache_dir=cache, local_files_only=True)
        self.model = AutoModelForCausalLM.from_pretrained(model_id, cache_dir=cache, **FROM_CACHE)
        self.model.eval()

    def encode(self, text: str) -> list[int]:
        return self.tokenizer(text)["input_ids"]

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True, clean_up_tokenization_spaces=False)

    def greedy(self, prompt_ids: list[int], max_new_tokens: int, **kwargs) -> list[int]:
        with torch.no_grad():
            output = self.model.generate(
                torch.tensor([prompt_ids]), attention_mask=torch.ones(1, len(prompt_ids), dtype=torch.long),
                max_new_tokens=max_new_tokens, do_sample=False, pad_token_id=self.tokenizer.pad_token_id, **kwargs,
            )
        return output[0, len(prompt_ids):].tolist()


@pytest.fixture(scope="session")
def reference(hf_cache) -> Reference:
    return Reference(hf_cache)


# A Qwen3-thinking-style template for the chat/Responses tests: the generation prompt opens
# `<think>` when thinking is on, or continues a prefill a request passes as a template kwarg.
THINKING_GENERATION_PROMPT = """{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
    {%- if assistant_prefill is defined %}
        {{- assistant_prefill }}
    {%- elif enable_thinking is defined and enable_thinking %}
        {{- '<think>\\n' }}
    {%- endif %}
{%- endif %}
"""


@pytest.fixture(scope="session")
def thinking_template(tmp_path_factory) -> Path:
    from workers.tiny.builders import CHAT_TEMPLATE_PATH

    base = CHAT_TEMPLATE_PATH.read_text()
    path = tmp_path_factory.mktemp("templates") / "thinking.jinja"
    path.write_text(base[:base.rindex("{%- if add_generation_prompt %}")] + THINKING_GENERATION_PROMPT)
    return path


@pytest.fixture(scope="session")
def thinking_server(hf_cache, tmp_path_factory, thinking_template):
    """`serve --chat-template FILE --reasoning on`: every chat starts inside <think>."""
    work_dir = tmp_path_factory.mktemp("thinking-server")
    live = LiveServer(base_env(hf_cache, work_dir), work_dir, name="thinking",
                      extra_args=("--chat-template", str(thinking_template), "--reasoning", "on"))
    yield live
    live.stop()


ENCODER = "local/tiny-encoder"
CAUSAL_EMBEDDER = "local/tiny-llama-embed"
CROSS_ENCODER = "local/tiny-cross-encoder"


@pytest.fixture(scope="session")
def embed_cache(tmp_path_factory) -> tuple[Path, Path]:
    """A cache with the text model, the embedding models and the cross-encoder; (cache, the encoder's snapshot)."""
    from workers.tiny.encoder import build_tiny_causal_embedder, build_tiny_cross_encoder, build_tiny_encoder

    cache = tmp_path_factory.mktemp("embed-cache")
    build_tiny_model(TINY_MODEL, cache_dir=cache)
    snapshot = build_tiny_encoder(ENCODER, cache_dir=cache)
    build_tiny_causal_embedder(CAUSAL_EMBEDDER, cache_dir=cache)
    build_tiny_cross_encoder(CROSS_ENCODER, cache_dir=cache)
    return cache, snapshot


def snapshot_of(cache: Path, repo_id: str) -> Path:
    """The one snapshot folder the tiny builders leave for `repo_id` in `cache`."""
    return next((cache / f"models--{repo_id.replace('/', '--')}" / "snapshots").iterdir())


TINY_VLM = "local/tiny-vlm"
TINY_WHISPER = "local/tiny-whisper"
TINY_AUDIO_LM = "local/tiny-audio-lm"
TINY_OMNI = "local/tiny-omni"  # a Gemma 4: vision and audio encoders beside the text model


@pytest.fixture(scope="session")
def media_cache(tmp_path_factory) -> Path:
    """A cache with the text model, the vision-language model, the audio-language model, the Whisper and the
    omni model."""
    from workers.tiny.multimodal import build_tiny_audio_lm, build_tiny_vlm, build_tiny_whisper
    from workers.tiny.omni import build_tiny_omni

    cache = tmp_path_factory.mktemp("hf-media-cache")
    build_tiny_model(TINY_MODEL, size="tiny", cache_dir=cache)
    build_tiny_vlm(TINY_VLM, cache_dir=cache)
    build_tiny_whisper(TINY_WHISPER, cache_dir=cache)
    build_tiny_audio_lm(TINY_AUDIO_LM, cache_dir=cache)
    build_tiny_omni(TINY_OMNI, cache_dir=cache)
    return cache


@pytest.fixture(scope="session")
def media_server(media_cache, tmp_path_factory):
    """Fetches from 127.0.0.1 allowed (the tests' own file server), 2 s fetch limit, 200 kB per media file."""
    work_dir = tmp_path_factory.mktemp("media-server")
    env = base_env(media_cache, work_dir, INFERENCE_MEDIA_ALLOW_HOSTS="127.0.0.1", INFERENCE_MEDIA_FETCH_TIMEOUT="2",
                   INFERENCE_MEDIA_MAX_BYTES="200000", INFERENCE_VIDEO_FRAMES="8", INFERENCE_WORKER_ACK_TIMEOUT="60")
    live = LiveServer(env, work_dir, name="media")
    yield live
    live.stop()


@pytest.fixture(scope="session")
def media_client(media_server) -> OpenAI:
    return OpenAI(base_url=f"{media_server.base_url}/v1", api_key=media_server.key, max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def redis_server(tmp_path_factory):
    """A private redis-server for one test module (the scale-out layer's tests)."""
    require_binary("redis-server")
    server = RedisServer(tmp_path_factory.mktemp("redis"))
    yield server
    server.stop()


@contextmanager
def engine_running(hf_cache: Path, emit: Callable[[str, dict], None], config) -> Iterator:
    """A real engine (workers.engine.core.engine.Engine) over the tests' cache, emitting to `emit`, stopped after."""
    from huggingface_hub import constants

    from workers.engine.core.engine import Engine

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(constants, "HF_HUB_CACHE", str(hf_cache))
        engine = Engine(emit, config)
        engine.start()
        try:
            yield engine
        finally:
            engine.stop()
