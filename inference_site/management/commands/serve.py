"""`manage.py serve`: the embedded default — Daphne, SQLite, in-process channel layer, one worker beside it."""
import asyncio
import json
import logging
import os
import sys
import time
from pathlib import Path

import daphne.server  # noqa: F401  (installs the asyncio Twisted reactor before anything imports one)
from daphne.endpoints import build_endpoint_description_strings
from django.conf import settings
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError

from catalog.hf_cache import cached_served_models
from catalog.local_folders import link_gguf, link_local_model
from inference_site import edge, version_line
from inference_site.inference_settings import SettingError
from protocol.dtypes import DTYPE_NAMES
from protocol.load_options import QUANTIZATIONS, check_attn_implementation, check_quantization
from workers.management.vllm_flags import (add_engine_flags, add_server_flags, allowed_origins, engine_flag_changes,
                                           pinned_model_entry, pinned_name)

from ..config_files import SERVER_KEYS, load_config, merged_options

# Settings a server config file (or a flag) sets, as (config key, INFERENCE_* environment variable suffix).
ENGINE_SETTINGS = (("device", "DEVICE"), ("dtype", "DTYPE"), ("model_timeout", "MODEL_TIMEOUT"),
                   ("max_num_seqs", "MAX_NUM_SEQS"), ("max_queue", "MAX_QUEUE"), ("prefill_chunk", "PREFILL_CHUNK"),
                   ("prefill_share", "PREFILL_SHARE"), ("quantization", "QUANTIZATION"),
                   ("attn_implementation", "ATTN_IMPLEMENTATION"), ("model", "MODEL"),
                   ("trust_remote_code", "TRUST_REMOTE_CODE"), ("default_seed", "DEFAULT_SEED"),
                   ("ignore_eos", "IGNORE_EOS"), ("log_level", "LOG_LEVEL"),
                   ("pass_message_extras", "PASS_MESSAGE_EXTRAS"))  # and the engine flags (engine_flag_changes)

logger = logging.getLogger(__name__)
RESTART_WINDOW_SECONDS = 600
RESTART_DELAY_SECONDS = 1.0  # the dead worker's last answers go out first
STOP_NOTICE_SECONDS = 3.0


def update_settings(changes: dict[str, str]) -> None:
    """`changes` (INFERENCE_* variables) set in this process's environment and `settings.INFERENCE` read again;
    a value its setting cannot take stops the start, naming the flag's variable."""
    if not changes:
        return
    try:
        settings.INFERENCE = settings.INFERENCE.updated(changes)
    except SettingError as exc:
        raise CommandError(str(exc)) from None


def given_key(token: str | None, token_file: str | None) -> str | None:
    """forgather's --auth-token / --auth-token-file: the key, read from a file no one else may read."""
    if token and token_file:
        raise CommandError("Give --auth-token or --auth-token-file, not both.")
    if not token_file:
        return token or None
    path = Path(token_file).expanduser()
    try:
        if path.stat().st_mode & 0o077:
            raise CommandError(f"--auth-token-file: {path} is readable by others; chmod 600 it.")
        return path.read_text().strip()
    except OSError as exc:
        raise CommandError(f"--auth-token-file: cannot read {path}: {exc.strerror}") from None


class Command(BaseCommand):
    help = "Serve the OpenAI-compatible API with a generation worker in the same process."

    def get_version(self) -> str:
        return version_line()

    def add_arguments(self, parser):
        parser.add_argument("pinned_model", nargs="?", metavar="MODEL",
                            help="pin a model (a repo id or a local model folder): loaded at start, never unloaded, "
                                 "and the model of requests that name none")
        parser.add_argument("-m", "--model", help="the same as MODEL")
        parser.add_argument("-c", "--from-checkpoint", nargs="?", const=True, metavar="CHECKPOINT",
                            help="serve the pinned model folder with the weights of its latest training checkpoint "
                                 "(FOLDER/checkpoints/checkpoint-*, as forgather saves them, or the Trainer's "
                                 "FOLDER/checkpoint-*), or of this checkpoint folder")
        parser.add_argument("--trust-remote-code", action="store_true", default=None,
                            help="let the pinned model's repo run its own Python code (other models: the catalog admin)")
        parser.add_argument("--quantization", choices=QUANTIZATIONS,
                            help="quantize every model on load unless its catalog row says otherwise (bnb-*: CUDA only)")
        parser.add_argument("--attn-implementation", metavar="NAME",
                            help="transformers' attention kernel for every model: eager, sdpa, flash_attention_2, "
                                 "flex_attention… (default: each model's own)")
        parser.add_argument("--enable-cors", action="store_true", default=None,
                            help="let browser pages on any origin call the API (CORS; requests still need the key)")
        parser.add_argument("--cors-allow-origins", "--allowed-origins", nargs="+", metavar="ORIGIN",
                            help="let browser pages on these origins call the API (e.g. http://localhost:3000); "
                                 "vLLM's --allowed-origins '[\"…\"]' (a JSON list) too")
        parser.add_argument("--default-seed", type=int, metavar="N", help="the seed of requests that send none")
        parser.add_argument("--stop-sequences", nargs="+", metavar="TEXT", help="stop strings added to every request's")
        parser.add_argument("--ignore-eos", action="store_true", default=None,
                            help="requests that do not say generate past EOS (to max_tokens or a stop)")
        parser.add_argument("--pass-message-extras", action="store_true", default=None,
                            help="chat messages' unknown fields go to the template as sent (default: ignored, "
                                 "with a debug log line; custom roles go to the template either way)")
        parser.add_argument("--log-level", choices=("DEBUG", "INFO", "WARNING", "ERROR"), type=str.upper)
        parser.add_argument("--config", metavar="FILE", help="a YAML server config (see the README); flags override it")
        parser.add_argument("--host", help="default 127.0.0.1")
        parser.add_argument("--port", type=int, help="default 8000")
        parser.add_argument("--device", help="auto, cpu, cuda, cuda:1…")
        parser.add_argument("--dtype", choices=DTYPE_NAMES, help="auto (the device's: bf16 on GPUs that have it, "
                                                                "fp16 on older ones, fp32 on CPU) or a name")
        parser.add_argument("--no-auth", action="store_true", help="turn bearer-key auth off (anyone who can connect can use it)")
        parser.add_argument("--auth-token", "--api-key", metavar="KEY",
                            help="accept this key (instead of a key file written for the port; vLLM's --api-key); "
                                 "visible to `ps`: prefer --auth-token-file")
        parser.add_argument("--auth-token-file", metavar="FILE", help="accept the key in this file (mode 0600)")
        parser.add_argument("--no-worker", action="store_true", help="web only: jobs go to `run_worker` processes over Redis")
        parser.add_argument("--chat-template", metavar="FILE", help="Jinja chat template used instead of every model's own")
        parser.add_argument("--chat-template-kwargs", metavar="JSON", help='default template kwargs, e.g. \'{"enable_thinking": false}\'')
        parser.add_argument("--model-timeout", type=float, metavar="SECONDS",
                            help="unload a model idle this long (default 300; -1: never)")
        parser.add_argument("--reasoning", choices=("auto", "on", "off"), help="on/off set enable_thinking in the template")
        add_engine_flags(parser)
        add_server_flags(parser)

    def handle(self, *args, no_worker: bool, **options):
        config = load_config(options["config"], SERVER_KEYS) if options.get("config") else {}
        options = merged_options(options, {**config, **config.get("batching", {})}, {"host": "127.0.0.1", "port": 8000})
        host, port = options["host"], options["port"]
        options["model"] = self._pinned_model(pinned_name(options.get("pinned_model") or options.get("model"),
                                                          options.get("revision"), options.get("tokenizer")),
                                              options.get("from_checkpoint"))
        model_entry = pinned_model_entry(options["model"], options)
        if options.get("trust_remote_code") and not options["model"]:
            raise CommandError("--trust-remote-code applies to the pinned model (serve MODEL --trust-remote-code); "
                               "other models take it from their catalog row (admin, or a config file's models:).")
        try:
            check_attn_implementation(options.get("attn_implementation") or "")
            check_quantization(options.get("quantization") or "")
        except ValueError as exc:
            raise CommandError(str(exc)) from None
        no_auth = options["no_auth"] or config.get("auth") is False
        kwargs = options.get("chat_template_kwargs")
        self._configure_chat(options.get("chat_template"), json.dumps(kwargs) if isinstance(kwargs, dict) else kwargs,
                             options.get("reasoning"))
        # Flags become environment variables (workers started from here inherit them), read again into the settings.
        changes = {**{f"INFERENCE_{setting}": str(options[key]) for key, setting in ENGINE_SETTINGS
                      if options.get(key) is not None},
                   **engine_flag_changes(options, settings.INFERENCE.engine.prefix_cache_bytes)}
        if options.get("stop_sequences"):
            changes["INFERENCE_STOP_SEQUENCES"] = json.dumps(list(options["stop_sequences"]))
        update_settings(changes)
        self._configure_cors(allowed_origins(options.get("cors_allow_origins")), bool(options.get("enable_cors")))
        if options.get("log_level"):  # settings.LOGGING too: the ASGI app's django.setup() applies it again
            settings.LOGGING["root"]["level"] = str(options["log_level"]).upper()
            logging.getLogger().setLevel(str(options["log_level"]).upper())
        logger.debug("serve's options after the config file: %s",
                     {key: value for key, value in options.items() if value not in (None, False, "", [])
                      and key not in ("verbosity", "settings", "pythonpath", "traceback", "no_color", "force_color",
                                      "skip_checks")})
        call_command("migrate", interactive=False, verbosity=0)
        if not no_worker and not options["model"]:
            self._ensure_a_model()
        from catalog.services.cached_models import scan_cache

        self.stdout.write(f"Model catalog: {scan_cache()}")
        if config.get("models") or model_entry:
            self._configure_models([*config.get("models", []), *([model_entry] if model_entry else [])])
        self._announce_auth(port, no_auth, given_key(options.get("auth_token"), options.get("auth_token_file")))
        self._allow_host(host)
        limits = edge.install()
        self.stdout.write(f"Connections: at most {limits.max_connections} descriptors, "
                          f"{limits.max_per_address or 'any number'} per client address; headers within "
                          f"{limits.header_timeout:g}s, idle connections closed after {limits.keepalive_timeout:g}s")
        from inference_site.asgi import api_app, application

        if not no_worker:  # the door refuses what the engine beside it could not take, before Django sees it
            from workers.adapter.runtime import engine_capacity

            api_app.capacity = engine_capacity
        edge.keep_the_door(api_app)

        def start_worker() -> None:
            from catalog.periodic import maintain_catalog
            from protocol.tasks import watch

            def keep_catalog(reason: str = "") -> None:  # upkeep is restarted; the server goes on meanwhile
                watch(maintain_catalog(), "the catalog upkeep",
                      lambda reason: asyncio.get_event_loop().call_later(5, keep_catalog))

            keep_catalog()
            from teams.ledger import LedgerWriter

            LedgerWriter.get()  # replays usage a killed process left in the spool, before the first request
            from openai_api.batches.runner import start_runner

            start_runner()  # resumes the batches a stopped process left (docs/batch.md)
            if not no_worker:
                self._start_worker()
            else:  # scale-out: the door answers queue_full from the workers' free slots
                from inference_site.fleet_capacity import watch_the_fleet

                watch_the_fleet(api_app)
            self.stdout.write(f"Serving on http://{host}:{port}/v1  (health: http://{host}:{port}/health)")
            self.stdout.flush()

        server = edge.EdgeServer(
            application=application,
            endpoints=[f"{endpoint}:backlog={settings.INFERENCE.edge.listen_backlog}"
                       for endpoint in build_endpoint_description_strings(host=host, port=port)],
            http_timeout=None,
            ready_callable=start_worker,
            verbosity=0,
            application_close_timeout=10,
        )
        self.worker_failure = ""
        self.restarts: list[float] = []
        server.run()
        if not no_worker:  # a clean shutdown says so: nothing is routed to this process's channel again
            from workers.adapter.runtime import mark_stopped

            mark_stopped()
        if self.worker_failure:  # exit non-zero: the supervisor starts a fresh server
            raise CommandError(f"The embedded worker stopped ({self.worker_failure}); the server stopped with it.")

    def _start_worker(self) -> None:
        from protocol.tasks import watch
        from workers.adapter.runtime import run_worker

        watch(run_worker(), "the embedded worker", self._worker_ended)

    def _worker_ended(self, reason: str) -> None:
        """The embedded worker (its engine) died: a fresh one, up to ENGINE_RESTARTS times in ten minutes,
        so a server without a supervisor comes back by itself; past that the fault is not passing (a broken
        device or model): /health says why for a few seconds, then the server stops, exit status 1."""
        from twisted.internet import reactor

        from openai_api.health import report_problem

        now = time.monotonic()
        self.restarts = [at for at in self.restarts if now - at < RESTART_WINDOW_SECONDS]
        allowed = settings.INFERENCE.lifecycle.engine_restarts
        if len(self.restarts) < allowed:
            self.restarts.append(now)
            logger.critical("%s; starting a fresh engine (restart %d of %d within %d minutes)", reason,
                            len(self.restarts), allowed, RESTART_WINDOW_SECONDS // 60)
            report_problem("embedded worker", f"restarting after: {reason}")

            def restart() -> None:
                self._start_worker()
                report_problem("embedded worker", None)

            reactor.callLater(RESTART_DELAY_SECONDS, restart)
            return
        why = f"{reason}; {len(self.restarts) + 1} engine failures within {RESTART_WINDOW_SECONDS // 60} minutes"
        logger.critical("stopping the server: %s", why)
        report_problem("embedded worker", f"stopping: {why}")
        self.worker_failure = why
        reactor.callLater(STOP_NOTICE_SECONDS, reactor.stop)  # /health says why before the process is gone

    def _configure_chat(self, template: str | None, kwargs: str | None, reasoning: str | None) -> None:
        """Chat flags become settings (through the environment, for workers started from here); bad values stop the
        start."""
        values = {}
        if template:
            path = Path(template).expanduser().resolve()
            if not path.is_file():
                raise CommandError(f"--chat-template: no such file: {path}")
            values["CHAT_TEMPLATE"] = str(path)
        if kwargs:
            try:
                parsed = json.loads(kwargs)
            except ValueError as exc:
                raise CommandError(f"--chat-template-kwargs is not JSON: {exc}") from exc
            if not isinstance(parsed, dict):
                raise CommandError("--chat-template-kwargs must be a JSON object.")
            values["CHAT_TEMPLATE_KWARGS"] = kwargs
        if reasoning:
            values["REASONING"] = reasoning
        update_settings({f"INFERENCE_{key}": value for key, value in values.items()})

    def _configure_cors(self, origins: list[str], any_origin: bool) -> None:
        """--enable-cors / --cors-allow-origins: CORS headers on the API for these origins (settings.py's CORS_*)."""
        if not origins and not any_origin:
            return
        bad = [origin for origin in origins if origin != "*" and not origin.startswith(("http://", "https://"))]
        if bad:
            raise CommandError(f"--cors-allow-origins: {bad[0]!r} is not an origin (scheme://host[:port]).")
        settings.CORS_ALLOW_ALL_ORIGINS = any_origin or "*" in origins
        settings.CORS_ALLOWED_ORIGINS = [origin.rstrip("/") for origin in origins if origin != "*"]
        update_settings({"INFERENCE_CORS_ORIGINS": "*" if settings.CORS_ALLOW_ALL_ORIGINS else ",".join(origins)})
        self.stdout.write("CORS: the API answers browser pages from "
                          f"{'any origin' if settings.CORS_ALLOW_ALL_ORIGINS else ', '.join(settings.CORS_ALLOWED_ORIGINS)}")

    def _allow_host(self, host: str) -> None:
        """The address served on is a valid Host (unless DJANGO_ALLOWED_HOSTS says exactly which are)."""
        if os.environ.get("DJANGO_ALLOWED_HOSTS"):
            return
        if host in ("0.0.0.0", "::"):
            import socket

            names = {socket.gethostname(), socket.getfqdn()}
            self.stderr.write(self.style.WARNING(
                f"Serving on every interface: requests must name this host ({', '.join(sorted(names))}) or "
                "localhost; set DJANGO_ALLOWED_HOSTS to the names clients use."))
        else:
            names = {f"[{host}]" if ":" in host else host}
        settings.ALLOWED_HOSTS.extend(sorted(names - set(settings.ALLOWED_HOSTS)))

    def _configure_models(self, entries: list[dict]) -> None:
        """The config file's per-model settings go into the catalog (chat templates are read from their files)."""
        from django.core.exceptions import ValidationError

        from catalog.errors import ModelNotFound
        from catalog.services.model_settings import configure_models

        for entry in entries:
            if entry.get("chat_template"):
                path = Path(entry["chat_template"]).expanduser()
                if not path.is_file():
                    raise CommandError(f"models[{entry['name']}].chat_template: no such file: {path}")
                entry["chat_template"] = path.read_text()
        try:
            configured = configure_models(entries)
        except ModelNotFound as exc:
            raise CommandError(f"--config: models: {exc.message} (not in the Hugging Face cache)") from exc
        except ValidationError as exc:
            raise CommandError(f"--config: models: {'; '.join(exc.messages)}") from exc
        self.stdout.write(f"Configured from the config file: {', '.join(configured)}")

    def _pinned_model(self, name: str | None, checkpoint: str | bool | None) -> str:
        """The pinned model's name: a local model folder is linked into the cache as `local/<folder>` (with a
        checkpoint's weights where asked); a repo that is neither cached nor downloadable stops the start (the
        worker downloads one that is not cached)."""
        if checkpoint and not (name and Path(name).expanduser().is_dir()):
            raise CommandError("--from-checkpoint serves a local model folder's checkpoint: serve FOLDER -c "
                               f"[CHECKPOINT] ({name or 'no model'} is not a folder)")
        if not name:
            return ""
        try:
            gguf = link_gguf(name)  # a .gguf file, or FOLDER:FILE
        except ValueError as exc:
            raise CommandError(f"MODEL: {exc}") from None
        if gguf:
            self.stdout.write(f"Serving {name} as {gguf}")
            return gguf
        if Path(name).expanduser().is_dir():
            try:
                linked = link_local_model(Path(name), checkpoint=Path(checkpoint) if isinstance(checkpoint, str)
                                          else checkpoint)
            except ValueError as exc:
                raise CommandError(f"{'--from-checkpoint' if checkpoint else 'MODEL'}: {exc}") from None
            self.stdout.write(f"Serving the folder {name} as {linked}"
                              + (" with a training checkpoint's weights (see the log)" if checkpoint else ""))
            return linked
        from protocol import ModelRef
        from protocol.hub import hub_reachable

        repo_id = ModelRef.parse(name).repo_id
        if not any(m.repo_id == repo_id for m in cached_served_models(fresh=True)) and not hub_reachable():
            raise CommandError(f"MODEL: {name} is not in the Hugging Face cache, and the hub is not reachable "
                               "to download it.")
        return name

    def _ensure_a_model(self) -> None:
        if cached_served_models():
            return
        name = settings.INFERENCE.models.fallback
        self.stdout.write(f"No model to serve in the Hugging Face cache: building {name} offline (random weights)…")
        call_command("create_tiny_model", name, size="tiny-long")

    def _announce_auth(self, port: int, no_auth: bool, given: str | None) -> None:
        if no_auth:
            update_settings({"INFERENCE_AUTH": "false"})
        if not settings.INFERENCE.teams.auth_enabled:
            self.stderr.write(self.style.WARNING(
                "WARNING: authentication is OFF. Anyone who can reach this port can use every model."
            ))
            return
        if given is not None:  # the operator's own key: accepted, never written to the port's key file
            from django.core.exceptions import ValidationError

            from teams.services import adopt_key

            try:
                adopt_key(given, f"serve --auth-token :{port}")
            except ValidationError as exc:
                raise CommandError(f"--auth-token: {'; '.join(exc.messages)}") from None
            self.stdout.write("Using the API key given by --auth-token / --auth-token-file "
                              '(send it as "Authorization: Bearer <key>")')
            sys.stdout.flush()
            return
        from teams.services import ensure_local_key

        raw_key, path, created = ensure_local_key(port)
        if created and sys.stdout.isatty():
            # Once, to the terminal only: a redirected stdout is a log file, and keys never go into logs.
            self.stdout.write(f"Created an API key for local use: {raw_key}")
        elif created:
            self.stdout.write(f"Created an API key for local use in {path}")
        else:
            self.stdout.write(f"Using the API key in {path}")
        self.stdout.write(f"API key file (mode 0600): {path}")
        self.stdout.write(f'Send it as "Authorization: Bearer <key>", e.g. export OPENAI_API_KEY=$(cat {path})')
        sys.stdout.flush()

