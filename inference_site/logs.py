"""Log records carry the request id of the HTTP request they belong to; LOG_FORMAT=json makes them JSON lines.

The id lives in a context variable set by the ASGI guard, so every line logged while a request
is handled (its view, its sync_to_async threads) names it; lines outside a request show "-".
Lines are formatted where they are logged and written to stderr by a thread of their own
(`BackgroundConsoleHandler`).
"""
from __future__ import annotations

import atexit
import contextvars
import json
import logging
import logging.handlers
import os
import queue
from datetime import datetime, timezone

REQUEST_ID: contextvars.ContextVar[str] = contextvars.ContextVar("request_id", default="-")


class RequestIdFilter(logging.Filter):
    """Adds `record.request_id` (a handler filter, so records of every logger get it)."""

    def filter(self, record: logging.LogRecord) -> bool:
        record.request_id = REQUEST_ID.get()
        return True


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message, request_id, and the traceback if any."""

    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "time": datetime.fromtimestamp(record.created, timezone.utc).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
            "request_id": getattr(record, "request_id", REQUEST_ID.get()),
        }
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, ensure_ascii=False, default=str)


class BackgroundConsoleHandler(logging.handlers.QueueHandler):
    """stderr, written by a listener thread: the thread that logs formats the line (its request id, its
    traceback) and queues it. A write is a system call, which gives up the GIL; on the event loop of a busy
    server, taking it back from the engine's thread waited, and every request logged two lines there (the
    logging cookbook's advice for handlers that block, as under asyncio). The queue is drained at exit and
    when logging is configured again or shut down (`close`); a forked child, which has no listener thread,
    starts one of its own."""

    def __init__(self) -> None:
        super().__init__(queue.SimpleQueue())
        self.listening = False
        self._listen()
        atexit.register(self.close)
        os.register_at_fork(after_in_child=self._listen_in_child)

    def _listen(self) -> None:
        self.listener = logging.handlers.QueueListener(self.queue, logging.StreamHandler())
        self.listener.start()
        self.listening = True

    def _listen_in_child(self) -> None:
        if self.listening:
            self.queue = queue.SimpleQueue()  # the parent's may have been held mid-call by its listener
            self._listen()

    def close(self) -> None:
        if self.listening:  # stop() drains the queue, and may run once
            self.listening = False
            self.listener.stop()
        super().close()


def logging_config(log_format: str, level: str) -> dict:
    """settings.LOGGING for LOG_FORMAT `plain` (default) or `json`."""
    formatters = {
        "plain": {"format": "%(asctime)s %(levelname)s %(name)s [%(request_id)s]: %(message)s"},
        "json": {"()": "inference_site.logs.JsonFormatter"},
    }
    if log_format not in formatters:
        raise ValueError(f"LOG_FORMAT must be plain or json, not {log_format!r}")
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "filters": {"request_id": {"()": "inference_site.logs.RequestIdFilter"}},
        "formatters": formatters,
        "handlers": {"console": {"()": "inference_site.logs.BackgroundConsoleHandler", "formatter": log_format,
                                 "filters": ["request_id"]}},
        "root": {"handlers": ["console"], "level": level},
        # Django's own 4xx warnings would repeat the guard's access line; 5xx still log with a traceback.
        # torchao, which transformers imports when it is installed, warns at every start that its CUDA and
        # Triton kernels cannot load on a CPU machine: nothing a user can act on.
        # torch warns (its own "W…" lines) that torchao registers Enums with pytree's register_constant: a
        # deprecation only torchao can act on.
        "loggers": {"django.request": {"level": "ERROR"}, "torchao": {"level": "ERROR"},
                    "torch.utils._pytree": {"level": "ERROR"}},
    }
