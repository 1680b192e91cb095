"""Settings for the inference site.

Every knob comes from an environment variable with a default that runs the
embedded mode (SQLite, in-process channel layer) with no services at all. The
inference service's own (INFERENCE_*, the channel layer's, logging's) are parsed
once by inference_settings.py into `INFERENCE`, typed groups by reader; Django's
own (DJANGO_*, DATABASE_URL) are read here with the same typed reads.
"""
import os
from datetime import timedelta
from pathlib import Path

import dj_database_url

from .inference_settings import Env, InferenceSettings
from .logs import logging_config
from .private_files import private_dir, private_file, secret_key

BASE_DIR = Path(__file__).resolve().parent.parent
env = Env(os.environ)  # typed reads: a bad value stops the start, naming the variable

# The inference service's own settings, typed, one group per reader (inference_site/inference_settings.py):
# settings.INFERENCE.teams, .fleet, .engine… Read once, here; nothing reads the environment again.
INFERENCE = InferenceSettings.from_environ(os.environ, BASE_DIR)
VAR_DIR = private_dir(INFERENCE.var_dir)

# Without DJANGO_SECRET_KEY, a random key generated on first start into the var dir (mode 0600).
SECRET_KEY = os.environ.get("DJANGO_SECRET_KEY") or secret_key(VAR_DIR)
DEBUG = env.flag("DJANGO_DEBUG", False)
# `serve --host H` adds H; the guard checks the Host header of API requests against this too.
ALLOWED_HOSTS = list(env.names("DJANGO_ALLOWED_HOSTS", "localhost,127.0.0.1,[::1]"))

# Everything `check --deploy` asks for, from the environment (the README's production recipe sets them).
SECURE_SSL_REDIRECT = env.flag("DJANGO_SECURE_SSL_REDIRECT", False)
SECURE_HSTS_SECONDS = env.integer("DJANGO_SECURE_HSTS_SECONDS", 0)
SECURE_HSTS_INCLUDE_SUBDOMAINS = env.flag("DJANGO_SECURE_HSTS_INCLUDE_SUBDOMAINS", False)
SECURE_HSTS_PRELOAD = env.flag("DJANGO_SECURE_HSTS_PRELOAD", False)
SESSION_COOKIE_SECURE = env.flag("DJANGO_SESSION_COOKIE_SECURE", False)
CSRF_COOKIE_SECURE = env.flag("DJANGO_CSRF_COOKIE_SECURE", False)
CSRF_TRUSTED_ORIGINS = list(env.names("DJANGO_CSRF_TRUSTED_ORIGINS"))
# Behind a TLS-terminating proxy: DJANGO_SECURE_PROXY_SSL_HEADER=HTTP_X_FORWARDED_PROTO,https
_proxy_header = env.names("DJANGO_SECURE_PROXY_SSL_HEADER")
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
AXES_FAILURE_LIMIT = INFERENCE.teams.login_failure_limit
AXES_COOLOFF_TIME = timedelta(minutes=INFERENCE.teams.login_lockout_minutes)
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
CORS_ALLOW_ALL_ORIGINS = "*" in INFERENCE.api.cors_origins
CORS_ALLOWED_ORIGINS = [origin for origin in INFERENCE.api.cors_origins if origin != "*"]
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

if INFERENCE.channel_layer.is_redis:
    CHANNEL_LAYERS = {
        "default": {
            "BACKEND": "inference_site.redis_layer.BatchingRedisChannelLayer",
            "CONFIG": {
                "hosts": [INFERENCE.channel_layer.url],
                "capacity": INFERENCE.channel_layer.capacity,
                "expiry": 120,
            },
        }
    }
else:
    CHANNEL_LAYERS = {
        "default": {
            "BACKEND": "inference_site.channel_layers.HandoverInMemoryChannelLayer",
            "CONFIG": {"capacity": INFERENCE.channel_layer.capacity, "expiry": 120},
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
LOGGING = logging_config(INFERENCE.logs.format, INFERENCE.logs.level)
