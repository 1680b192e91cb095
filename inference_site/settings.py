"""Settings for the inference site.

Every knob comes from an environment variable with a default that runs the
embedded mode (SQLite, in-process channel layer) with no services at all.
"""
import os
from datetime import timedelta
from pathlib import Path

import dj_database_url

from .logs import logging_config
from .private_files import private_dir, private_file, secret_key

BASE_DIR = Path(__file__).resolve().parent.parent
VAR_DIR = private_dir(Path(os.environ.get("INFERENCE_VAR_DIR", BASE_DIR / "var")))


def env_bool(name: str, default: bool) -> bool:
    value = os.environ.get(name)
    if value is None or value == "":
        return default
    return value.strip().lower() in {"1", "true", "yes", "on"}


def env_int(name: str, default: int) -> int:
    value = os.environ.get(name)
    return int(value) if value not in (None, "") else default


def env_float(name: str, default: float) -> float:
    value = os.environ.get(name)
    return float(value) if value not in (None, "") else default


def env_json_list(name: str) -> list[str]:
    """A JSON list of strings (stop strings may hold commas); unset or empty: []."""
    import json

    value = json.loads(os.environ.get(name) or "[]")
    if not isinstance(value, list) or not all(isinstance(item, str) and item for item in value):
        raise ValueError(f"{name} must be a JSON list of non-empty strings")
    return value


def env_list(name: str, default: str) -> list[str]:
    return [item.strip() for item in os.environ.get(name, default).split(",") if item.strip()]


# Without DJANGO_SECRET_KEY, a random key generated on first start into the var dir (mode 0600).
SECRET_KEY = os.environ.get("DJANGO_SECRET_KEY") or secret_key(VAR_DIR)
DEBUG = env_bool("DJANGO_DEBUG", False)
# `serve --host H` adds H; the guard checks the Host header of API requests against this too.
ALLOWED_HOSTS = env_list("DJANGO_ALLOWED_HOSTS", "localhost,127.0.0.1,[::1]")

# Everything `check --deploy` asks for, from the environment (the README's production recipe sets them).
SECURE_SSL_REDIRECT = env_bool("DJANGO_SECURE_SSL_REDIRECT", False)
SECURE_HSTS_SECONDS = env_int("DJANGO_SECURE_HSTS_SECONDS", 0)
SECURE_HSTS_INCLUDE_SUBDOMAINS = env_bool("DJANGO_SECURE_HSTS_INCLUDE_SUBDOMAINS", False)
SECURE_HSTS_PRELOAD = env_bool("DJANGO_SECURE_HSTS_PRELOAD", False)
SESSION_COOKIE_SECURE = env_bool("DJANGO_SESSION_COOKIE_SECURE", False)
CSRF_COOKIE_SECURE = env_bool("DJANGO_CSRF_COOKIE_SECURE", False)
CSRF_TRUSTED_ORIGINS = env_list("DJANGO_CSRF_TRUSTED_ORIGINS", "")
# Behind a TLS-terminating proxy: DJANGO_SECURE_PROXY_SSL_HEADER=HTTP_X_FORWARDED_PROTO,https
_proxy_header = env_list("DJANGO_SECURE_PROXY_SSL_HEADER", "")
SECURE_PROXY_SSL_HEADER = tuple(_proxy_header) if len(_proxy_header) == 2 else None
X_FRAME_OPTIONS = "DENY"

INSTALLED_APPS = [
    "daphne",
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "channels",
    "catalog",
    "teams",
    "openai_api",
    "workers",
    "webui",
    "inference_site",  # the composition root's commands: serve, client
    "axes",  # login throttling (docs/reliability.md)
    "corsheaders",  # CORS on the API, for browser front ends on other origins (off until origins are named)
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "axes.middleware.AxesMiddleware",  # last, as django-axes asks: answers a locked-out login
]

# Logins (the admin's and the pages'): after AXES_FAILURE_LIMIT failures for one username, or from one
# address, that username or address is locked out for AXES_COOLOFF_TIME (429 with a message saying
# so); a success resets the count. An admin lifts a lockout in the admin (Axes > Access attempts) or
# with `manage.py axes_reset_username NAME` / `axes_reset_ip ADDRESS`.
AUTHENTICATION_BACKENDS = ["axes.backends.AxesStandaloneBackend", "django.contrib.auth.backends.ModelBackend"]
AXES_FAILURE_LIMIT = env_int("INFERENCE_LOGIN_FAILURE_LIMIT", 5)
AXES_COOLOFF_TIME = timedelta(minutes=env_float("INFERENCE_LOGIN_LOCKOUT_MINUTES", 15.0))
AXES_LOCKOUT_PARAMETERS = ["username", "ip_address"]
AXES_RESET_ON_SUCCESS = True
AXES_LOCKOUT_CALLABLE = "inference_site.lockout.locked_out"
AXES_CLIENT_IP_CALLABLE = "teams.client_address.axes_client_ip"  # through INFERENCE_TRUSTED_PROXIES only
AXES_VERBOSE = False

# The API's own stack (see asgi.py): bearer keys in DRF need no sessions, CSRF or messages,
# and every sync middleware costs a thread hop on each request.
# CorsMiddleware answers a CORS preflight (OPTIONS) itself, before any authentication.
API_MIDDLEWARE: list[str] = ["inference_site.cors_log.RefusedPreflightLog", "corsheaders.middleware.CorsMiddleware"]

# CORS (django-cors-headers), on the API's paths only (the pages and the admin never get it): the origins a
# browser front end may call the API from (INFERENCE_CORS_ORIGINS, comma-separated; "*": any, as
# `serve --enable-cors`). Requests carry a bearer key, never cookies: no credentials mode.
_cors_origins = env_list("INFERENCE_CORS_ORIGINS", "")
CORS_ALLOW_ALL_ORIGINS = "*" in _cors_origins
CORS_ALLOWED_ORIGINS = [origin for origin in _cors_origins if origin != "*"]
CORS_ALLOW_CREDENTIALS = False
CORS_ALLOW_HEADERS = (
    "accept", "authorization", "content-type", "user-agent", "x-requested-with", "x-request-id",
    "openai-beta", "openai-organization", "openai-project", "x-stainless-arch", "x-stainless-lang",
    "x-stainless-os", "x-stainless-package-version", "x-stainless-retry-count", "x-stainless-runtime",
    "x-stainless-runtime-version", "x-stainless-timeout", "x-stainless-helper-method", "x-stainless-async",
)
CORS_EXPOSE_HEADERS = ("x-request-id", "x-ratelimit-limit-requests", "x-ratelimit-remaining-requests",
                       "x-ratelimit-reset-requests", "x-ratelimit-limit-tokens", "x-ratelimit-remaining-tokens",
                       "x-ratelimit-reset-tokens", "retry-after")
CORS_PREFLIGHT_MAX_AGE = 3600

# Paths served with the full MIDDLEWARE stack (sessions, CSRF, auth, messages): the admin, static
# files and the browser pages; every other path is the API's (see asgi.py).
FULL_STACK_PATHS = ("/admin", "/static/", "/login", "/logout", "/chat", "/playground", "/account", "/ui/")
FULL_STACK_EXACT_PATHS = ("/",)

ROOT_URLCONF = "inference_site.urls"
APPEND_SLASH = False

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

ASGI_APPLICATION = "inference_site.asgi.application"

DATABASES = {
    "default": dj_database_url.config(
        env="DATABASE_URL",
        default=f"sqlite:///{VAR_DIR / 'db.sqlite3'}",
        # Under ASGI, Django advises against persistent connections: each request's thread opens
        # its own. Every ORM call from a pool thread goes through channels' database_sync_to_async,
        # which closes it again, so a database restart leaves no dead connection behind.
        conn_max_age=0,
        conn_health_checks=True,
    )
}
if DATABASES["default"]["ENGINE"].endswith("sqlite3"):
    if DATABASES["default"]["NAME"] != ":memory:":
        private_file(Path(DATABASES["default"]["NAME"]))  # never world-readable (SQLite keeps the mode)
    # Concurrent request threads and the worker share one file: wait, don't fail.
    DATABASES["default"].setdefault("OPTIONS", {})["timeout"] = 20
    # Write transactions take the lock up front: a read that later writes would otherwise fail
    # at once with "database is locked" when a worker's heartbeat and a request write together.
    DATABASES["default"]["OPTIONS"]["transaction_mode"] = "IMMEDIATE"

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

CHANNEL_LAYER_URL = os.environ.get("CHANNEL_LAYER_URL", "")
CHANNEL_CAPACITY = env_int("CHANNEL_CAPACITY", 10_000)
if CHANNEL_LAYER_URL.startswith(("redis://", "rediss://", "unix://")):
    CHANNEL_LAYERS = {
        "default": {
            "BACKEND": "inference_site.redis_layer.BatchingRedisChannelLayer",
            "CONFIG": {
                "hosts": [CHANNEL_LAYER_URL],
                "capacity": CHANNEL_CAPACITY,
                "expiry": 120,
            },
        }
    }
else:
    CHANNEL_LAYERS = {
        "default": {
            "BACKEND": "inference_site.channel_layers.HandoverInMemoryChannelLayer",
            "CONFIG": {"capacity": CHANNEL_CAPACITY, "expiry": 120},
        }
    }

REST_FRAMEWORK = {
    # A bearer key, else the session cookie of a user logged in to our pages (CSRF enforced);
    # either way the request carries a teams Principal and is counted against the team.
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "teams.authentication.BearerKeyAuthentication",
        "teams.authentication.SessionPrincipalAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["teams.authentication.HasPrincipal"],
    "DEFAULT_PARSER_CLASSES": ["openai_api.parsers.BoundedJSONParser"],
    "DEFAULT_RENDERER_CLASSES": ["rest_framework.renderers.JSONRenderer"],
    "EXCEPTION_HANDLER": "openai_api.errors.exception_handler",
    "UNAUTHENTICATED_USER": None,
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
}

# /openapi.json and /docs (drf-spectacular; Swagger UI and Redoc served from drf-spectacular-sidecar).
SPECTACULAR_SETTINGS = {
    "TITLE": "inference-site",
    "DESCRIPTION": "An OpenAI-compatible inference server for Hugging Face models.",
    "VERSION": "1.0.0",
    "OAS_VERSION": "3.1.0",
    "SERVE_INCLUDE_SCHEMA": False,
    "SERVE_PERMISSIONS": ["rest_framework.permissions.AllowAny"],
    "SERVE_AUTHENTICATION": [],
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    "COMPONENT_SPLIT_REQUEST": True,
    "ENUM_GENERATE_CHOICE_DESCRIPTION": False,
    # One name for a choice set several fields share (chat's reasoning_effort and Responses' reasoning.effort).
    "ENUM_NAME_OVERRIDES": {"ReasoningEffortEnum": "openai_api.serializers.openai_params.REASONING_EFFORTS",
                            "ReasoningSummaryEnum": "openai_api.serializers.openai_params.SUMMARIES"},
}

# The inference service's own knobs, all from the environment.
INFERENCE = {
    # Bearer-key auth on every endpoint but /health; `serve --no-auth` turns it off.
    "AUTH_ENABLED": env_bool("INFERENCE_AUTH", True),
    # Where `serve` writes the key it creates on first start (mode 0600).
    "KEY_DIR": Path(
        os.environ.get(
            "INFERENCE_KEY_DIR",
            Path(os.environ.get("XDG_CONFIG_HOME", Path.home() / ".config")) / "inference_site",
        )
    ),
    "MAX_REQUEST_BYTES": env_int("INFERENCE_MAX_REQUEST_BYTES", 2 * 1024 * 1024),
    # Arrays and objects in a JSON body may nest this deep (checked before parsing; deeper is a 400).
    "MAX_JSON_DEPTH": env_int("INFERENCE_MAX_JSON_DEPTH", 64),
    # Addresses (comma-separated networks) that may scrape /metrics without a key.
    "METRICS_ALLOW": os.environ.get("INFERENCE_METRICS_ALLOW", "127.0.0.1/32,::1/128"),
    "MAX_N": env_int("INFERENCE_MAX_N", 16),
    "MAX_PROMPTS": env_int("INFERENCE_MAX_PROMPTS", 64),
    # Named channel every worker listens on; cancellations go to a group of all workers.
    "WORKER_CHANNEL": os.environ.get("INFERENCE_WORKER_CHANNEL", "inference"),
    "WORKER_GROUP": os.environ.get("INFERENCE_WORKER_GROUP", "inference-workers"),
    # How long a view waits for some worker to acknowledge a job before answering 503.
    "WORKER_ACK_TIMEOUT": env_float("INFERENCE_WORKER_ACK_TIMEOUT", 15.0),
    # How long a view waits between two events of a running job before giving up.
    "WORKER_EVENT_TIMEOUT": env_float("INFERENCE_WORKER_EVENT_TIMEOUT", 600.0),
    # Worker death: a worker says "alive" on a job's reply channel after this long without a message;
    # a reply channel silent for WORKER_SILENCE_TIMEOUT means its worker died. A job that had produced
    # no token yet is then sent again (at most JOB_RESUBMITS times), else it ends with a 503.
    "WORKER_KEEPALIVE_SECONDS": env_float("INFERENCE_WORKER_KEEPALIVE_SECONDS", 0.5),
    "WORKER_SILENCE_TIMEOUT": env_float("INFERENCE_WORKER_SILENCE_TIMEOUT", 2.0),
    "JOB_RESUBMITS": env_int("INFERENCE_JOB_RESUBMITS", 2),
    # A stream whose first chunk is not ready yet (queued behind running sequences, sent again after
    # its worker died) gets an SSE comment this often, so its client and any proxy see it alive.
    "SSE_KEEPALIVE_SECONDS": env_float("INFERENCE_SSE_KEEPALIVE_SECONDS", 1.0),
    # A worker that passes a job on runs it itself if the receiver does not confirm within this long.
    "ROUTE_ACK_TIMEOUT": env_float("INFERENCE_ROUTE_ACK_TIMEOUT", 1.0),
    # Web side under overload: generation requests one web process holds at once (more: 503 +
    # Retry-After at once; 0: no limit), and the listen backlog `serve` asks the kernel for.
    "WEB_MAX_IN_FLIGHT": env_int("INFERENCE_WEB_MAX_IN_FLIGHT", 1024),
    "LISTEN_BACKLOG": env_int("INFERENCE_LISTEN_BACKLOG", 2048),
    # /health: how long it waits for the database and for some worker to answer a ping.
    "HEALTH_TIMEOUT": env_float("INFERENCE_HEALTH_TIMEOUT", 2.0),
    "SHUTDOWN_GRACE_SECONDS": env_float("INFERENCE_SHUTDOWN_GRACE_SECONDS", 10.0),
    # Media in chat/Responses (worker side): bytes one image/audio/video may have, how long fetching an
    # http(s) URL may take, and hosts fetched even though they resolve to private or local addresses
    # (comma-separated; none by default). A video becomes this many frames, sampled evenly.
    "MEDIA_MAX_BYTES": env_int("INFERENCE_MEDIA_MAX_BYTES", 20 * 1024 * 1024),
    "MEDIA_FETCH_TIMEOUT": env_float("INFERENCE_MEDIA_FETCH_TIMEOUT", 10.0),
    "MEDIA_ALLOW_HOSTS": [h.strip().lower() for h in os.environ.get("INFERENCE_MEDIA_ALLOW_HOSTS", "").split(",")
                          if h.strip()],
    "VIDEO_FRAMES": env_int("INFERENCE_VIDEO_FRAMES", 8),
    # The chat page's conversation store: bytes one user's conversations may take in all (attachments
    # are kept inside them as data URLs, and go when the conversation is deleted).
    "UI_STORAGE_BYTES_PER_USER": env_int("INFERENCE_UI_STORAGE_BYTES_PER_USER", 200 * 1024 * 1024),
    # Worker side.
    "DEVICE": os.environ.get("INFERENCE_DEVICE", "auto"),
    "DTYPE": os.environ.get("INFERENCE_DTYPE", "auto"),
    "TORCH_THREADS": env_int("INFERENCE_TORCH_THREADS", 0),
    # The worker process's GIL switch interval (ms) while its engine runs (workers/engine/core/engine.py); 0: Python's.
    "GIL_SWITCH_MS": env_float("INFERENCE_GIL_SWITCH_MS", 0.0),
    # SDPA's cuDNN backend on CUDA (off: flash / memory-efficient kernels; see workers/engine/models/model_loader.py).
    "CUDNN_ATTENTION": env_bool("INFERENCE_CUDNN_ATTENTION", False),
    "STATIC_DECODE": os.environ.get("INFERENCE_STATIC_DECODE", "auto"),
    "CUDA_GRAPHS": env_bool("INFERENCE_CUDA_GRAPHS", True),
    # Every model's quantization on load and attention kernel where its catalog row sets none
    # (protocol/load_options.py lists both; "": none / the model's default).
    "QUANTIZATION": os.environ.get("INFERENCE_QUANTIZATION", ""),
    "ATTN_IMPLEMENTATION": os.environ.get("INFERENCE_ATTN_IMPLEMENTATION", ""),
    # Continuous batching: sequences decoded together, requests that may wait beyond them
    # (more get 503 + Retry-After at once), prompt tokens prefilled per engine step, and, while
    # streams are running, a step's prefill time as a multiple of its decode time (workers/engine/core/prefill_pacing.py).
    "MAX_NUM_SEQS": env_int("INFERENCE_MAX_NUM_SEQS", 0),  # 0: fit the device (256 on CUDA, 32 on CPU)
    # vLLM's engine flags (serve/run_worker --max-model-len, --seed, --generation-config; issue 49).
    "MAX_MODEL_LEN": env_int("INFERENCE_MAX_MODEL_LEN", 0),  # caps every model's context; 0: each model's own
    "SEED": env_int("INFERENCE_SEED", 0) if os.environ.get("INFERENCE_SEED") else None,  # the engine's RNG at start
    "GENERATION_CONFIG": os.environ.get("INFERENCE_GENERATION_CONFIG", "auto"),  # auto, vllm, or a folder
    # Rows batch-priority work may hold while interactive work runs or waits; -1: fit the device
    # (every slot on CUDA, 2 on CPU). Below the slots, batch prompts are not prefilled beside interactive decode.
    "BATCH_ROWS_BESIDE_INTERACTIVE": env_int("INFERENCE_BATCH_ROWS_BESIDE_INTERACTIVE", -1),
    "MAX_QUEUE": env_int("INFERENCE_MAX_QUEUE", 256),
    "PREFILL_CHUNK": env_int("INFERENCE_PREFILL_CHUNK", 0),  # 0: fit the device (8192 on CUDA, 512 on CPU)
    "PREFILL_SHARE": env_float("INFERENCE_PREFILL_SHARE", 0.5),
    # Structured outputs: a grammar compiling longer than this is a 400 (the engine never waits on
    # it), compiled grammars kept per worker, and the size/nesting a JSON schema may have.
    "GRAMMAR_TIMEOUT": env_float("INFERENCE_GRAMMAR_TIMEOUT", 10.0),
    "GRAMMAR_CACHE_SIZE": env_int("INFERENCE_GRAMMAR_CACHE_SIZE", 64),
    "MAX_SCHEMA_BYTES": env_int("INFERENCE_MAX_SCHEMA_BYTES", 64 * 1024),
    "MAX_SCHEMA_DEPTH": env_int("INFERENCE_MAX_SCHEMA_DEPTH", 32),
    "MAX_BEAMS": env_int("INFERENCE_MAX_BEAMS", 16),
    # The most logprobs alternatives a request may ask for (completions' logprobs, chat's top_logprobs,
    # prompt_logprobs), as vLLM's --max-logprobs.
    "MAX_LOGPROBS": env_int("INFERENCE_MAX_LOGPROBS", 20),
    # Stored Responses (store: true): kept this many days, and a request whose stored conversation
    # (earlier turns + this input) would pass this many bytes is refused.
    "RESPONSES_RETENTION_DAYS": env_float("INFERENCE_RESPONSES_RETENTION_DAYS", 30.0),
    "RESPONSES_MAX_BYTES": env_int("INFERENCE_RESPONSES_MAX_BYTES", 4 * 1024 * 1024),
    # KV cache memory (MiB) the running sequences may reserve (prompt + max_tokens each); 0: no limit
    # beyond MAX_NUM_SEQS. A sequence waits until its reservation fits beside the running ones'.
    "KV_BUDGET_MB": env_float("INFERENCE_KV_BUDGET_MB", 0.0),
    # Keys/values of recent prompts kept per model for later prompts that start the same way (MiB; 0: off).
    "PREFIX_CACHE_MB": env_float("INFERENCE_PREFIX_CACHE_MB", 512.0),
    # /v1/embeddings inputs pooled in one forward per engine step (workers/engine/tasks/embedding.py).
    "EMBEDDING_BATCH": env_int("INFERENCE_EMBEDDING_BATCH", 32),
    "STREAM_INTERVAL": env_int("INFERENCE_STREAM_INTERVAL", 1),
    # Server-wide request defaults (forgather's): the seed of a request that sends none (""/unset: none,
    # as OpenAI), stop strings added to every request's own (a JSON list), and ignore_eos for requests
    # that do not say (off, as OpenAI).
    "DEFAULT_SEED": env_int("INFERENCE_DEFAULT_SEED", -1) if os.environ.get("INFERENCE_DEFAULT_SEED") else None,
    "STOP_SEQUENCES": env_json_list("INFERENCE_STOP_SEQUENCES"),
    "IGNORE_EOS": env_bool("INFERENCE_IGNORE_EOS", False),
    # A chat message's unknown fields and a role outside OpenAI's go to the chat template as sent (vLLM's way);
    # off: a 400, as OpenAI.
    "PASS_MESSAGE_EXTRAS": env_bool("INFERENCE_PASS_MESSAGE_EXTRAS", False),
    "DEFAULT_MODEL": os.environ.get("INFERENCE_DEFAULT_MODEL", "local/tiny-llama"),
    # A pinned model (`serve MODEL`): preloaded, never unloaded, the model of requests that name none (and what
    # the pages open on); TRUST_REMOTE_CODE lets its repo's own code run (other models: their catalog row).
    "MODEL": os.environ.get("INFERENCE_MODEL", ""),
    "TRUST_REMOTE_CODE": env_bool("INFERENCE_TRUST_REMOTE_CODE", False),
    # Chat templates (worker side): a Jinja file that overrides every model's own template,
    # default template kwargs (JSON object), and reasoning auto|on|off (on/off set enable_thinking).
    "CHAT_TEMPLATE": os.environ.get("INFERENCE_CHAT_TEMPLATE", ""),
    "CHAT_TEMPLATE_KWARGS": os.environ.get("INFERENCE_CHAT_TEMPLATE_KWARGS", ""),
    "REASONING": os.environ.get("INFERENCE_REASONING", "auto"),
    # Model catalog: seconds idle before a worker unloads a model (-1: never; `serve --model-timeout`),
    # a worker's memory budget for loaded models (MiB, 0: none; the least recently used idle model
    # makes room), how often workers beat, when a silent one counts as lost, how often `serve` rescans.
    "MODEL_TIMEOUT": env_float("INFERENCE_MODEL_TIMEOUT", 300.0),
    "WORKER_MEMORY_BUDGET_MB": env_float("INFERENCE_WORKER_MEMORY_BUDGET_MB", 0.0),
    "HEARTBEAT_SECONDS": env_float("INFERENCE_HEARTBEAT_SECONDS", 3.0),
    "WORKER_LOST_AFTER": env_float("INFERENCE_WORKER_LOST_AFTER", 15.0),
    "SCAN_INTERVAL": env_float("INFERENCE_SCAN_INTERVAL", 60.0),
    # Workers pass a job for a model they do not hold to a worker that holds it, else to the one
    # with the most free memory (false: whichever worker takes a job from the shared channel runs it).
    "ROUTE_JOBS": env_bool("INFERENCE_ROUTE_JOBS", True),
    # Team limits: counters in this Redis (default: the Redis channel layer's), else in the database.
    "LIMITS_REDIS_URL": os.environ.get(
        "INFERENCE_LIMITS_REDIS_URL", CHANNEL_LAYER_URL if CHANNEL_LAYER_URL.startswith(("redis://", "rediss://")) else ""
    ),
    # The usage ledger is written in batches by a background thread: at most this many rows
    # or this many seconds apart.
    "LEDGER_BATCH_SIZE": env_int("INFERENCE_LEDGER_BATCH_SIZE", 200),
    "LEDGER_FLUSH_SECONDS": env_float("INFERENCE_LEDGER_FLUSH_SECONDS", 0.5),
    # Usage that is never lost (docs/reliability.md): rows queued in memory at most (a full queue
    # makes requests wait up to LEDGER_PUT_WAIT seconds, then leaves the row to the spool), tries
    # per batch against the database, and the spool every row is appended to before it is queued
    # (replayed into the database once it is back, and after a kill -9, every LEDGER_REPLAY_SECONDS).
    "LEDGER_QUEUE_MAX": env_int("INFERENCE_LEDGER_QUEUE_MAX", 10000),
    "LEDGER_PUT_WAIT": env_float("INFERENCE_LEDGER_PUT_WAIT", 1.0),
    "LEDGER_WRITE_TRIES": env_int("INFERENCE_LEDGER_WRITE_TRIES", 3),
    "LEDGER_SPOOL_DIR": os.environ.get("INFERENCE_LEDGER_SPOOL_DIR", str(VAR_DIR / "ledger-spool")),
    "LEDGER_REPLAY_SECONDS": env_float("INFERENCE_LEDGER_REPLAY_SECONDS", 5.0),
    # The engine loop: failing turns in a row before the engine is dead and its worker exits, and
    # how long a loop may go without a heartbeat before ping and /health call it stalled.
    "ENGINE_MAX_FAULTS": env_int("INFERENCE_ENGINE_MAX_FAULTS", 5),
    "ENGINE_STALL_SECONDS": env_float("INFERENCE_ENGINE_STALL_SECONDS", 60.0),
    # `serve` starts a fresh engine when its embedded one dies, this many times within ten minutes; one
    # more death and it stops (exit status 1, /health saying why first) for a supervisor to restart it.
    "ENGINE_RESTARTS": env_int("INFERENCE_ENGINE_RESTARTS", 3),
    # A request body that stops arriving (Content-Length larger than what is sent) is answered 408
    # after this many seconds without a byte.
    "BODY_READ_TIMEOUT": env_float("INFERENCE_BODY_READ_TIMEOUT", 5.0),
    # The edge of `serve` (inference_site/edge.py): a request line + headers must arrive within
    # HEADER_TIMEOUT seconds; an idle connection between requests is closed after KEEPALIVE_TIMEOUT;
    # a body slower than MIN_BODY_RATE bytes/s on average (after its first BODY_READ_TIMEOUT seconds)
    # is a 408; one client address (an IPv6 /64) holds at most MAX_CONNECTIONS_PER_ADDRESS connections
    # (trusted proxies exempt), all of them at most MAX_CONNECTIONS file descriptors (0: the open-file
    # limit less FD_RESERVE, kept for the database, the channel layer, the spool and model files).
    "HEADER_TIMEOUT": env_float("INFERENCE_HEADER_TIMEOUT", 10.0),
    "KEEPALIVE_TIMEOUT": env_float("INFERENCE_KEEPALIVE_TIMEOUT", 20.0),
    "MIN_BODY_RATE": env_int("INFERENCE_MIN_BODY_RATE", 500),
    "MAX_CONNECTIONS_PER_ADDRESS": env_int("INFERENCE_MAX_CONNECTIONS_PER_ADDRESS", 1024),
    "MAX_CONNECTIONS": env_int("INFERENCE_MAX_CONNECTIONS", 0),
    "FD_RESERVE": env_int("INFERENCE_FD_RESERVE", 256),
    # Proxies whose X-Forwarded-For is believed (comma-separated networks; none by default): the client
    # address that throttles, login lockouts and /metrics' allow-list see (teams/client_address.py).
    "TRUSTED_PROXIES": os.environ.get("INFERENCE_TRUSTED_PROXIES", ""),
    # The Batch API (docs/batch.md): where uploaded and produced files are kept, the largest upload and
    # the most lines a batch may have, lines one process runs at once, how often a runner looks for
    # work and beats, and how long a silent runner's batches wait before another process takes them.
    "BATCH_FILES_DIR": os.environ.get("INFERENCE_BATCH_FILES_DIR", str(VAR_DIR / "batch-files")),
    "BATCH_FILE_MAX_BYTES": env_int("INFERENCE_BATCH_FILE_MAX_BYTES", 100 * 1024 * 1024),
    "BATCH_MAX_LINES": env_int("INFERENCE_BATCH_MAX_LINES", 50000),
    "BATCH_CONCURRENCY": env_int("INFERENCE_BATCH_CONCURRENCY", 8),
    "BATCH_POLL_SECONDS": env_float("INFERENCE_BATCH_POLL_SECONDS", 2.0),
    "BATCH_LOST_AFTER": env_float("INFERENCE_BATCH_LOST_AFTER", 30.0),
    # Wrong bearer keys from one client address (or with one key prefix) within the window before
    # that address's (prefix's) wrong keys get 429s; a valid key is served whatever (teams/bad_keys.py).
    "BAD_KEY_LIMIT": env_int("INFERENCE_BAD_KEY_LIMIT", 50),
    "BAD_KEY_WINDOW": env_float("INFERENCE_BAD_KEY_WINDOW", 60.0),
}

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATIC_ROOT = VAR_DIR / "static"
STATICFILES_DIRS = [BASE_DIR / "static"]

# The browser pages (webui): Django's session login.
LOGIN_URL = "/login"
LOGIN_REDIRECT_URL = "/chat"
LOGOUT_REDIRECT_URL = "/login"
SESSION_COOKIE_HTTPONLY = True
SESSION_COOKIE_SAMESITE = "Lax"
CSRF_COOKIE_SAMESITE = "Strict"

# LOG_FORMAT=json: one JSON object per line; every line of a request names its X-Request-Id.
LOGGING = logging_config(os.environ.get("LOG_FORMAT", "plain"), os.environ.get("INFERENCE_LOG_LEVEL", "INFO"))
