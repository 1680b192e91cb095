"""The web side's settings, typed and read in one place (the worker's counterpart is `workers.engine.config`).

`web_config()` reads `settings.INFERENCE` (inference_site/settings.py owns every default and the
environment variable behind each) into a frozen `WebConfig`. It lives in the catalog, the lowest
web app that reads settings, so that teams and the API (above it) import it too. It is built once
and kept (requests read it many times each); a change to `settings.INFERENCE` made through
`set_inference` (as `serve` does before it starts) or Django's `override_settings` drops the kept one.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.signals import setting_changed


@dataclass(frozen=True)
class WebConfig:
    # Workers: the channel jobs go to, the group cancels and pings go to, and when a silent one is lost.
    worker_channel: str
    worker_group: str
    worker_lost_after: float
    heartbeat_seconds: float  # how often the catalog upkeep runs (and workers beat)
    scan_interval: float  # seconds between cache rescans; 0: never
    # A job's round trip (openai_api.generation).
    worker_ack_timeout: float
    worker_event_timeout: float
    worker_silence_timeout: float
    job_resubmits: int
    sse_keepalive_seconds: float
    health_timeout: float
    # What a request may ask for (openai_api).
    max_request_bytes: int
    max_json_depth: int
    max_n: int
    max_prompts: int
    max_beams: int
    max_logprobs: int  # top alternatives a request may ask for per token (vLLM's max_logprobs)
    max_schema_bytes: int
    max_schema_depth: int
    # Server-wide request defaults (`serve --default-seed/--stop-sequences/--ignore-eos`).
    default_seed: int | None
    stop_sequences: tuple[str, ...]
    ignore_eos: bool
    pass_message_extras: bool  # unknown message fields and custom roles go to the template (vLLM's way)
    metrics_allow: str  # comma-separated networks that may scrape /metrics without a key
    # Teams.
    auth_enabled: bool
    key_dir: Path
    limits_redis_url: str  # "": the database keeps the limit counters
    ledger_batch_size: int
    ledger_flush_seconds: float
    ledger_queue_max: int  # rows held in memory; past it a request waits `ledger_put_wait`, then the spool keeps it
    ledger_put_wait: float
    ledger_write_tries: int
    ledger_spool_dir: Path
    ledger_replay_seconds: float
    bad_key_limit: int  # wrong bearer keys from one address within `bad_key_window` before it gets 429s
    bad_key_window: float
    trusted_proxies: str  # comma-separated networks whose X-Forwarded-For is believed (teams.client_address)
    # Stored Responses.
    responses_max_bytes: int
    responses_retention_days: float
    # The browser pages.
    default_model: str  # what they open on when the user chose nothing yet (the pinned model, if any)
    # The pinned model (`serve MODEL`): preloaded, never unloaded, the model of a request that names none.
    pinned_model: str
    pinned_trust_remote_code: bool
    ui_storage_bytes_per_user: int
    # The Batch API (openai_api.batches).
    batch_files_dir: Path
    batch_file_max_bytes: int
    batch_max_lines: int
    batch_concurrency: int  # lines one process runs at once, over all its batches
    batch_poll_seconds: float
    batch_lost_after: float  # a runner silent this long has died: its batches are taken over

    @classmethod
    def from_settings(cls, inference: Mapping[str, Any]) -> WebConfig:
        """From `settings.INFERENCE`."""
        return cls(
            worker_channel=inference["WORKER_CHANNEL"], worker_group=inference["WORKER_GROUP"],
            worker_lost_after=inference["WORKER_LOST_AFTER"], heartbeat_seconds=inference["HEARTBEAT_SECONDS"],
            scan_interval=inference["SCAN_INTERVAL"],
            worker_ack_timeout=inference["WORKER_ACK_TIMEOUT"], worker_event_timeout=inference["WORKER_EVENT_TIMEOUT"],
            worker_silence_timeout=inference["WORKER_SILENCE_TIMEOUT"], job_resubmits=inference["JOB_RESUBMITS"],
            sse_keepalive_seconds=inference["SSE_KEEPALIVE_SECONDS"], health_timeout=inference["HEALTH_TIMEOUT"],
            max_request_bytes=inference["MAX_REQUEST_BYTES"], max_json_depth=inference["MAX_JSON_DEPTH"],
            max_n=inference["MAX_N"], max_prompts=inference["MAX_PROMPTS"], max_beams=inference["MAX_BEAMS"], max_logprobs=inference["MAX_LOGPROBS"],
            max_schema_bytes=inference["MAX_SCHEMA_BYTES"], max_schema_depth=inference["MAX_SCHEMA_DEPTH"],
            metrics_allow=inference["METRICS_ALLOW"],
            default_seed=inference.get("DEFAULT_SEED"), stop_sequences=tuple(inference.get("STOP_SEQUENCES") or ()),
            ignore_eos=bool(inference.get("IGNORE_EOS")), pass_message_extras=bool(inference.get("PASS_MESSAGE_EXTRAS")),
            auth_enabled=inference["AUTH_ENABLED"], key_dir=Path(inference["KEY_DIR"]),
            limits_redis_url=inference["LIMITS_REDIS_URL"] or "",
            ledger_batch_size=inference["LEDGER_BATCH_SIZE"], ledger_flush_seconds=inference["LEDGER_FLUSH_SECONDS"],
            ledger_queue_max=inference["LEDGER_QUEUE_MAX"], ledger_put_wait=inference["LEDGER_PUT_WAIT"],
            ledger_write_tries=inference["LEDGER_WRITE_TRIES"], ledger_spool_dir=Path(inference["LEDGER_SPOOL_DIR"]),
            ledger_replay_seconds=inference["LEDGER_REPLAY_SECONDS"],
            bad_key_limit=inference["BAD_KEY_LIMIT"], bad_key_window=inference["BAD_KEY_WINDOW"],
            trusted_proxies=inference["TRUSTED_PROXIES"],
            responses_max_bytes=inference["RESPONSES_MAX_BYTES"],
            responses_retention_days=inference["RESPONSES_RETENTION_DAYS"],
            default_model=inference.get("MODEL") or inference["DEFAULT_MODEL"],
            pinned_model=inference.get("MODEL") or "", pinned_trust_remote_code=bool(inference.get("TRUST_REMOTE_CODE")),
            ui_storage_bytes_per_user=inference["UI_STORAGE_BYTES_PER_USER"],
            batch_files_dir=Path(inference["BATCH_FILES_DIR"]), batch_file_max_bytes=inference["BATCH_FILE_MAX_BYTES"],
            batch_max_lines=inference["BATCH_MAX_LINES"], batch_concurrency=inference["BATCH_CONCURRENCY"],
            batch_poll_seconds=inference["BATCH_POLL_SECONDS"], batch_lost_after=inference["BATCH_LOST_AFTER"],
        )


_kept: WebConfig | None = None


def web_config() -> WebConfig:
    global _kept
    if _kept is None:
        _kept = WebConfig.from_settings(settings.INFERENCE)
    return _kept


def forget_web_config(**_signal) -> None:
    """The next `web_config()` reads the settings again."""
    global _kept
    _kept = None


def set_inference(key: str, value: Any) -> None:
    """One `settings.INFERENCE` value changed in place (a `serve` flag), seen by every later reader."""
    settings.INFERENCE[key] = value
    forget_web_config()


setting_changed.connect(forget_web_config)
