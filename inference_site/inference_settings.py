"""The inference service's settings: every `INFERENCE_*` environment variable (and the few others the site
reads), parsed once, typed and checked, into frozen groups, one per reader.

`inference_site/settings.py` builds one `InferenceSettings` at start (`settings.INFERENCE`); a reader takes
its group (`settings.INFERENCE.teams.auth_enabled`, `settings.INFERENCE.fleet.worker_channel`…) and nothing
reads the environment again. The engine's group is its own `EngineConfig` (workers/engine/config.py, plain
Python): the worker's adapter passes `settings.INFERENCE.engine` down, so the engine never sees Django.

A bad value stops the start with a `SettingError` that names the variable, the value and what it must be.
`serve` and `run_worker` turn their flags into environment variables (workers they start inherit them) and
read the settings again with `InferenceSettings.updated`. Nothing here imports Django: settings.py imports
it before Django is set up.
"""
from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from workers.engine.config import EngineConfig, TemplateSettings
from protocol.sizes import parse_bytes
from protocol.speculative import SpeculativeConfig, parse_speculative_config
from workers.media.limits import MIB, MediaSettings

TRUE_WORDS = frozenset({"1", "true", "yes", "on"})
FALSE_WORDS = frozenset({"0", "false", "no", "off"})
REDIS_SCHEMES = ("redis://", "rediss://")
PROJECT_DIR = Path(__file__).resolve().parent.parent  # the default var dir is PROJECT_DIR/var


class SettingError(ValueError):
    """An environment variable holds a value its setting cannot take."""


class Env:
    """Typed reads of one environment (unset or empty: the default), each failing with the variable's name."""

    def __init__(self, environ: Mapping[str, str]) -> None:
        self.environ = environ

    def _given(self, name: str) -> str | None:
        value = self.environ.get(name)
        return None if value is None or value == "" else value

    def text(self, name: str, default: str) -> str:
        """The value as set (an empty value stays empty); unset: `default`."""
        return self.environ.get(name, default)

    def integer(self, name: str, default: int) -> int:
        value = self._given(name)
        if value is None:
            return default
        try:
            return int(value)
        except ValueError:
            raise SettingError(f"{name}={value!r}: must be a whole number (default {default})") from None

    def optional_integer(self, name: str) -> int | None:
        """A whole number, or None when unset or empty."""
        return self.integer(name, 0) if self._given(name) is not None else None

    def size(self, name: str) -> int | None:
        """A size in bytes (`parse_bytes`), or None when unset or empty."""
        value = self._given(name)
        if value is None:
            return None
        try:
            return parse_bytes(value)
        except ValueError as exc:
            raise SettingError(f"{name}={value!r}: {exc}") from None

    def number(self, name: str, default: float) -> float:
        value = self._given(name)
        if value is None:
            return default
        try:
            return float(value)
        except ValueError:
            raise SettingError(f"{name}={value!r}: must be a number (default {default:g})") from None

    def flag(self, name: str, default: bool) -> bool:
        value = self._given(name)
        if value is None:
            return default
        word = value.strip().lower()
        if word in TRUE_WORDS:
            return True
        if word in FALSE_WORDS:
            return False
        raise SettingError(f"{name}={value!r}: must be one of 1/true/yes/on or 0/false/no/off "
                           f"(default {'true' if default else 'false'})")

    def names(self, name: str, default: str = "") -> tuple[str, ...]:
        """A comma-separated list, items stripped, empty ones dropped."""
        return tuple(item.strip() for item in self.environ.get(name, default).split(",") if item.strip())

    def json_strings(self, name: str) -> tuple[str, ...]:
        """A JSON list of non-empty strings (stop strings may hold commas); unset or empty: ()."""
        raw = self.environ.get(name) or "[]"
        try:
            value = json.loads(raw)
        except ValueError:
            value = None
        if not isinstance(value, list) or not all(isinstance(item, str) and item for item in value):
            raise SettingError(f"{name}={raw!r}: must be a JSON list of non-empty strings")
        return tuple(value)


@dataclass(frozen=True)
class ChannelLayerSettings:
    """settings.py's CHANNEL_LAYERS: in-process, or Redis for scale-out."""

    url: str  # CHANNEL_LAYER_URL: redis://, rediss:// or unix://; "": the in-process layer
    capacity: int  # CHANNEL_CAPACITY: messages one channel may hold

    @property
    def is_redis(self) -> bool:
        return self.url.startswith((*REDIS_SCHEMES, "unix://"))


@dataclass(frozen=True)
class LogSettings:
    """settings.py's LOGGING (inference_site/logs.py)."""

    format: str  # LOG_FORMAT: plain, or json (one object per line)
    level: str  # INFERENCE_LOG_LEVEL


@dataclass(frozen=True)
class EdgeSettings:
    """The edge of `serve` (inference_site/edge.py) and the ASGI door (inference_site/asgi.py)."""

    header_timeout: float  # a request line + headers arrive within this many seconds (408 after)
    keepalive_timeout: float  # an idle connection between requests is closed after this long
    body_read_timeout: float  # seconds without a body byte before a 408
    min_body_rate: int  # bytes/s a body averages after its first body_read_timeout seconds
    max_connections_per_address: int  # one client address (an IPv6 /64); trusted proxies exempt; 0: no cap
    max_connections: int  # file descriptors for connections and spooled bodies; 0: the open-file limit less fd_reserve
    fd_reserve: int  # descriptors kept for the database, the channel layer, the spool and model files
    web_max_in_flight: int  # generation requests one web process holds at once (more: 503); 0: no limit
    listen_backlog: int  # the listen backlog `serve` asks the kernel for


@dataclass(frozen=True)
class LifecycleSettings:
    """Starting and stopping: `serve`'s engine restarts and the graceful stop (web edge and workers)."""

    engine_restarts: int  # fresh engines `serve` starts within ten minutes when its embedded one dies
    shutdown_grace_seconds: float  # SIGINT/SIGTERM: streams in flight run on this long


@dataclass(frozen=True)
class ApiSettings:
    """openai_api: what a request may ask for, server-wide request defaults, CORS, /metrics, /health, Responses."""

    max_request_bytes: int  # larger bodies get 413
    max_json_depth: int  # arrays and objects nested deeper are a 400 (checked before parsing)
    max_n: int
    max_prompts: int
    max_beams: int
    max_logprobs: int  # top alternatives a request may ask for per token (vLLM's --max-logprobs)
    max_schema_bytes: int  # the largest JSON schema a structured output may have
    max_schema_depth: int
    default_seed: int | None  # the seed of a request that sends none; None: unseeded, as OpenAI
    stop_sequences: tuple[str, ...]  # stop strings added to every request's own
    ignore_eos: bool  # ignore_eos of a request that does not say
    pass_message_extras: bool  # unknown message fields and custom roles go to the template (vLLM's way)
    cors_origins: tuple[str, ...]  # origins whose browser pages may call the API; "*": any
    metrics_allow: str  # comma-separated networks that may scrape /metrics without a key
    health_timeout: float  # how long /health waits for the database and a worker's ping
    responses_retention_days: float  # stored Responses are kept this long
    responses_max_bytes: int  # a stored conversation larger than this is refused


@dataclass(frozen=True)
class JobSettings:
    """A job's round trip between a view (openai_api.generation) and a worker (workers.adapter)."""

    worker_ack_timeout: float  # a view waits this long for some worker to take a job before a 503
    worker_event_timeout: float  # ... and this long between two events of a running job
    worker_keepalive_seconds: float  # a worker says "alive" on a reply channel silent this long
    worker_silence_timeout: float  # a reply channel silent this long means its worker died
    job_resubmits: int  # times a job with no token yet is sent again after its worker died
    sse_keepalive_seconds: float  # an SSE comment this often while a stream waits for its first chunk


@dataclass(frozen=True)
class FleetSettings:
    """The workers as the catalog, the views and the adapter see them: channels, heartbeats, routing."""

    worker_channel: str  # the named channel every worker listens on
    worker_group: str  # the group of all workers (cancellations, pings, settings)
    heartbeat_seconds: float  # how often workers beat (and the catalog upkeep runs)
    worker_lost_after: float  # a worker silent this long counts as lost
    scan_interval: float  # seconds between `serve`'s cache rescans; 0: never
    route_jobs: bool  # pass a job to a worker that holds its model (false: whoever takes it runs it)
    route_ack_timeout: float  # a worker that passed a job on runs it itself if unconfirmed this long


@dataclass(frozen=True)
class ServedModels:
    """Which model a request that names none gets (catalog, openai_api, webui, `serve`)."""

    pinned: str  # INFERENCE_MODEL (`serve MODEL`): preloaded, never unloaded; "": none
    pinned_trust_remote_code: bool  # the pinned model's repo may run its own code
    fallback: str  # INFERENCE_DEFAULT_MODEL: built offline by `serve` when the cache holds none

    @property
    def default(self) -> str:
        """The model the pages open on and tgi's routes use: the pinned one, else the fallback."""
        return self.pinned or self.fallback


@dataclass(frozen=True)
class TeamSettings:
    """teams: authentication, keys, limits, logins."""

    auth_enabled: bool  # bearer keys on every endpoint but /health; `serve --no-auth` turns it off
    key_dir: Path  # where `serve` writes the key it creates (mode 0600)
    limits_redis_url: str  # the team limit counters; "": the database keeps them
    bad_key_limit: int  # wrong bearer keys from one address within bad_key_window before 429s
    bad_key_window: float
    trusted_proxies: str  # comma-separated networks whose X-Forwarded-For is believed (teams.client_address)
    login_failure_limit: int  # failed logins per username or address before a lockout (django-axes)
    login_lockout_minutes: float  # how long a lockout lasts


@dataclass(frozen=True)
class LedgerSettings:
    """teams.ledger: the usage ledger's batched writer and its spool."""

    batch_size: int  # rows per insert at most
    flush_seconds: float  # the longest a row waits for its batch
    queue_max: int  # rows held in memory; past it a request waits put_wait, then the spool keeps its row
    put_wait: float
    write_tries: int  # tries per batch against the database
    spool_dir: Path  # every row is appended here before it is queued
    replay_seconds: float  # how often kept and abandoned spool segments are replayed


@dataclass(frozen=True)
class BatchSettings:
    """openai_api.batches: the Batch API."""

    files_dir: Path  # uploaded and produced files
    file_max_bytes: int  # the largest upload
    max_lines: int  # the most lines a batch may have
    concurrency: int  # lines one process runs at once, over all its batches
    poll_seconds: float  # how often a runner looks for work and beats
    lost_after: float  # a runner silent this long has died: its batches are taken over


@dataclass(frozen=True)
class PageSettings:
    """webui: the browser pages."""

    ui_storage_bytes_per_user: int  # what one user's saved conversations may take


@dataclass(frozen=True)
class InferenceSettings:
    """Every group, built once by settings.py (`settings.INFERENCE`)."""

    var_dir: Path  # INFERENCE_VAR_DIR: the private directory (database, secret key, spool, batch files)
    channel_layer: ChannelLayerSettings
    logs: LogSettings
    edge: EdgeSettings
    lifecycle: LifecycleSettings
    api: ApiSettings
    jobs: JobSettings
    fleet: FleetSettings
    models: ServedModels
    teams: TeamSettings
    ledger: LedgerSettings
    batches: BatchSettings
    pages: PageSettings
    engine: EngineConfig  # the worker's engine: device, batching, templates, media (workers/engine/config.py)

    @classmethod
    def from_environ(cls, environ: Mapping[str, str], base_dir: Path = PROJECT_DIR) -> InferenceSettings:
        """Every setting from `environ`; `base_dir` holds the default var dir."""
        env = Env(environ)
        var_dir = Path(env.text("INFERENCE_VAR_DIR", str(base_dir / "var")))
        layer = ChannelLayerSettings(url=env.text("CHANNEL_LAYER_URL", ""),
                                     capacity=env.integer("CHANNEL_CAPACITY", 10_000))
        config_home = Path(environ.get("XDG_CONFIG_HOME", Path.home() / ".config"))
        return cls(
            var_dir=var_dir,
            channel_layer=layer,
            logs=LogSettings(format=env.text("LOG_FORMAT", "plain"), level=env.text("INFERENCE_LOG_LEVEL", "INFO")),
            edge=EdgeSettings(
                header_timeout=env.number("INFERENCE_HEADER_TIMEOUT", 10.0),
                keepalive_timeout=env.number("INFERENCE_KEEPALIVE_TIMEOUT", 20.0),
                body_read_timeout=env.number("INFERENCE_BODY_READ_TIMEOUT", 5.0),
                min_body_rate=env.integer("INFERENCE_MIN_BODY_RATE", 500),
                max_connections_per_address=env.integer("INFERENCE_MAX_CONNECTIONS_PER_ADDRESS", 1024),
                max_connections=env.integer("INFERENCE_MAX_CONNECTIONS", 0),
                fd_reserve=env.integer("INFERENCE_FD_RESERVE", 256),
                web_max_in_flight=env.integer("INFERENCE_WEB_MAX_IN_FLIGHT", 1024),
                listen_backlog=env.integer("INFERENCE_LISTEN_BACKLOG", 2048),
            ),
            lifecycle=LifecycleSettings(
                engine_restarts=env.integer("INFERENCE_ENGINE_RESTARTS", 3),
                shutdown_grace_seconds=env.number("INFERENCE_SHUTDOWN_GRACE_SECONDS", 10.0),
            ),
            api=ApiSettings(
                max_request_bytes=env.integer("INFERENCE_MAX_REQUEST_BYTES", 2 * MIB),
                max_json_depth=env.integer("INFERENCE_MAX_JSON_DEPTH", 64),
                max_n=env.integer("INFERENCE_MAX_N", 16),
                max_prompts=env.integer("INFERENCE_MAX_PROMPTS", 64),
                max_beams=env.integer("INFERENCE_MAX_BEAMS", 16),
                max_logprobs=env.integer("INFERENCE_MAX_LOGPROBS", 20),
                max_schema_bytes=env.integer("INFERENCE_MAX_SCHEMA_BYTES", 64 * 1024),
                max_schema_depth=env.integer("INFERENCE_MAX_SCHEMA_DEPTH", 32),
                default_seed=env.optional_integer("INFERENCE_DEFAULT_SEED"),
                stop_sequences=env.json_strings("INFERENCE_STOP_SEQUENCES"),
                ignore_eos=env.flag("INFERENCE_IGNORE_EOS", False),
                pass_message_extras=env.flag("INFERENCE_PASS_MESSAGE_EXTRAS", False),
                cors_origins=env.names("INFERENCE_CORS_ORIGINS"),
                metrics_allow=env.text("INFERENCE_METRICS_ALLOW", "127.0.0.1/32,::1/128"),
                health_timeout=env.number("INFERENCE_HEALTH_TIMEOUT", 2.0),
                responses_retention_days=env.number("INFERENCE_RESPONSES_RETENTION_DAYS", 30.0),
                responses_max_bytes=env.integer("INFERENCE_RESPONSES_MAX_BYTES", 4 * MIB),
            ),
            jobs=JobSettings(
                worker_ack_timeout=env.number("INFERENCE_WORKER_ACK_TIMEOUT", 15.0),
                worker_event_timeout=env.number("INFERENCE_WORKER_EVENT_TIMEOUT", 600.0),
                worker_keepalive_seconds=env.number("INFERENCE_WORKER_KEEPALIVE_SECONDS", 0.5),
                worker_silence_timeout=env.number("INFERENCE_WORKER_SILENCE_TIMEOUT", 2.0),
                job_resubmits=env.integer("INFERENCE_JOB_RESUBMITS", 2),
                sse_keepalive_seconds=env.number("INFERENCE_SSE_KEEPALIVE_SECONDS", 1.0),
            ),
            fleet=FleetSettings(
                worker_channel=env.text("INFERENCE_WORKER_CHANNEL", "inference"),
                worker_group=env.text("INFERENCE_WORKER_GROUP", "inference-workers"),
                heartbeat_seconds=env.number("INFERENCE_HEARTBEAT_SECONDS", 3.0),
                worker_lost_after=env.number("INFERENCE_WORKER_LOST_AFTER", 15.0),
                scan_interval=env.number("INFERENCE_SCAN_INTERVAL", 60.0),
                route_jobs=env.flag("INFERENCE_ROUTE_JOBS", True),
                route_ack_timeout=env.number("INFERENCE_ROUTE_ACK_TIMEOUT", 1.0),
            ),
            models=ServedModels(
                pinned=env.text("INFERENCE_MODEL", ""),
                pinned_trust_remote_code=env.flag("INFERENCE_TRUST_REMOTE_CODE", False),
                fallback=env.text("INFERENCE_DEFAULT_MODEL", "local/tiny-llama"),
            ),
            teams=TeamSettings(
                auth_enabled=env.flag("INFERENCE_AUTH", True),
                key_dir=Path(env.text("INFERENCE_KEY_DIR", str(config_home / "inference_site"))),
                # Default: the Redis channel layer's Redis, else none (the database).
                limits_redis_url=env.text("INFERENCE_LIMITS_REDIS_URL",
                                          layer.url if layer.url.startswith(REDIS_SCHEMES) else ""),
                bad_key_limit=env.integer("INFERENCE_BAD_KEY_LIMIT", 50),
                bad_key_window=env.number("INFERENCE_BAD_KEY_WINDOW", 60.0),
                trusted_proxies=env.text("INFERENCE_TRUSTED_PROXIES", ""),
                login_failure_limit=env.integer("INFERENCE_LOGIN_FAILURE_LIMIT", 5),
                login_lockout_minutes=env.number("INFERENCE_LOGIN_LOCKOUT_MINUTES", 15.0),
            ),
            ledger=LedgerSettings(
                batch_size=env.integer("INFERENCE_LEDGER_BATCH_SIZE", 200),
                flush_seconds=env.number("INFERENCE_LEDGER_FLUSH_SECONDS", 0.5),
                queue_max=env.integer("INFERENCE_LEDGER_QUEUE_MAX", 10000),
                put_wait=env.number("INFERENCE_LEDGER_PUT_WAIT", 1.0),
                write_tries=env.integer("INFERENCE_LEDGER_WRITE_TRIES", 3),
                spool_dir=Path(env.text("INFERENCE_LEDGER_SPOOL_DIR", str(var_dir / "ledger-spool"))),
                replay_seconds=env.number("INFERENCE_LEDGER_REPLAY_SECONDS", 5.0),
            ),
            batches=BatchSettings(
                files_dir=Path(env.text("INFERENCE_BATCH_FILES_DIR", str(var_dir / "batch-files"))),
                file_max_bytes=env.integer("INFERENCE_BATCH_FILE_MAX_BYTES", 100 * MIB),
                max_lines=env.integer("INFERENCE_BATCH_MAX_LINES", 50000),
                concurrency=env.integer("INFERENCE_BATCH_CONCURRENCY", 8),
                poll_seconds=env.number("INFERENCE_BATCH_POLL_SECONDS", 2.0),
                lost_after=env.number("INFERENCE_BATCH_LOST_AFTER", 30.0),
            ),
            pages=PageSettings(ui_storage_bytes_per_user=env.integer("INFERENCE_UI_STORAGE_BYTES_PER_USER", 200 * MIB)),
            engine=engine_config(env),
        )

    def updated(self, changes: Mapping[str, str]) -> InferenceSettings:
        """These environment variables set in this process (workers started from it inherit them), and every
        setting read again: how `serve` and `run_worker` apply their flags."""
        os.environ.update(changes)
        return self.from_environ(os.environ)


def speculative_config(env: Env) -> SpeculativeConfig | None:
    """INFERENCE_SPECULATIVE_CONFIG: vLLM's --speculative-config JSON (off when unset)."""
    text = env.text("INFERENCE_SPECULATIVE_CONFIG", "")
    try:
        return parse_speculative_config(text)
    except ValueError as exc:
        raise SettingError(f"INFERENCE_SPECULATIVE_CONFIG={text!r}: {exc}") from None


def gpu_memory_utilization(env: Env) -> float | None:
    """INFERENCE_GPU_MEMORY_UTILIZATION: vLLM's share of the device's memory, over (0, 1]; unset: none."""
    value = env.number("INFERENCE_GPU_MEMORY_UTILIZATION", 0.0)
    if not 0.0 <= value <= 1.0:
        raise SettingError(f"INFERENCE_GPU_MEMORY_UTILIZATION={value:g}: a share of the device's memory, over 0 to 1 "
                           "(e.g. 0.9)")
    return value or None


def rows_apart_bytes(env: Env) -> int | None:
    """INFERENCE_ROWS_APART_MB: what a long row's decoding apart from the slab must save (workers/engine/execution/
    kv/apart.py): `auto` (64 MiB on a CPU, a quarter of the KV budget on a GPU), MiB, or `off` (-1: never)."""
    value = env.text("INFERENCE_ROWS_APART_MB", "auto").strip().lower() or "auto"
    if value in ("auto", "off"):
        return None if value == "auto" else -1
    try:
        mib = float(value)
    except ValueError:
        mib = -1.0
    if mib < 0:
        raise SettingError(f"INFERENCE_ROWS_APART_MB={value!r}: `auto`, `off`, or MiB a row apart must save (e.g. 64)")
    return int(mib * MIB)


def engine_config(env: Env) -> EngineConfig:
    """The engine's settings (worker side); 0 or -1 leave a choice to the device (`EngineConfig.fitted`)."""
    memory_budget_mb = env.number("INFERENCE_WORKER_MEMORY_BUDGET_MB", 0.0)  # 0: no budget
    kv_cache = env.size("INFERENCE_KV_CACHE_MEMORY") or int(env.number("INFERENCE_KV_BUDGET_MB", 0.0) * MIB)
    return EngineConfig(
        device=env.text("INFERENCE_DEVICE", "auto"),
        dtype=env.text("INFERENCE_DTYPE", "auto"),
        torch_threads=env.integer("INFERENCE_TORCH_THREADS", 0),
        gil_switch_ms=env.number("INFERENCE_GIL_SWITCH_MS", 0.0),
        cudnn_attention=env.flag("INFERENCE_CUDNN_ATTENTION", False),
        quantization=env.text("INFERENCE_QUANTIZATION", ""),
        attn_implementation=env.text("INFERENCE_ATTN_IMPLEMENTATION", ""),
        max_num_seqs=env.integer("INFERENCE_MAX_NUM_SEQS", 0),
        max_model_len=env.integer("INFERENCE_MAX_MODEL_LEN", 0),
        tensor_parallel_size=max(1, env.integer("INFERENCE_TENSOR_PARALLEL_SIZE", 1)),
        seed=env.optional_integer("INFERENCE_SEED"),
        generation_config=env.text("INFERENCE_GENERATION_CONFIG", "auto") or "auto",
        batch_rows_beside_interactive=env.integer("INFERENCE_BATCH_ROWS_BESIDE_INTERACTIVE", -1),
        max_queue=env.integer("INFERENCE_MAX_QUEUE", 256),
        prefill_chunk=env.integer("INFERENCE_PREFILL_CHUNK", 0),
        prefill_share=env.number("INFERENCE_PREFILL_SHARE", 0.5),
        model_timeout=env.number("INFERENCE_MODEL_TIMEOUT", 300.0),
        memory_budget_bytes=int(memory_budget_mb * MIB) or None,
        grammar_timeout=env.number("INFERENCE_GRAMMAR_TIMEOUT", 10.0),
        grammar_cache_size=env.integer("INFERENCE_GRAMMAR_CACHE_SIZE", 64),
        kv_cache_bytes=kv_cache or None,  # None: each model's device share of free memory (kv/budget.py)
        gpu_memory_utilization=gpu_memory_utilization(env),
        prefix_cache_bytes=int(env.number("INFERENCE_PREFIX_CACHE_MB", EngineConfig.prefix_cache_bytes / MIB) * MIB),
        rows_apart_bytes=rows_apart_bytes(env),
        max_faults=env.integer("INFERENCE_ENGINE_MAX_FAULTS", 5),
        stall_seconds=env.number("INFERENCE_ENGINE_STALL_SECONDS", 60.0),
        embedding_batch=env.integer("INFERENCE_EMBEDDING_BATCH", 32),
        stream_interval=max(1, env.integer("INFERENCE_STREAM_INTERVAL", 1)),
        static_decode=env.text("INFERENCE_STATIC_DECODE", "auto"),
        cuda_graphs=env.flag("INFERENCE_CUDA_GRAPHS", True),
        speculative=speculative_config(env),
        templates=TemplateSettings(path=env.text("INFERENCE_CHAT_TEMPLATE", ""),
                                   kwargs_json=env.text("INFERENCE_CHAT_TEMPLATE_KWARGS", ""),
                                   reasoning=env.text("INFERENCE_REASONING", "auto") or "auto"),
        media=MediaSettings(max_bytes=env.integer("INFERENCE_MEDIA_MAX_BYTES", 20 * MIB),
                            fetch_timeout=env.number("INFERENCE_MEDIA_FETCH_TIMEOUT", 10.0),
                            allow_hosts=frozenset(host.lower() for host in env.names("INFERENCE_MEDIA_ALLOW_HOSTS")),
                            video_frames=env.integer("INFERENCE_VIDEO_FRAMES", 8)),
    )
