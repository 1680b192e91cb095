"""A Python that has imported torch and transformers once and forks the tests' `manage.py` processes from there.

A server's start is mostly imports: torch, transformers' loading modules and torchao (which transformers imports
when it is installed) are ~4 of its ~6 s on a 2-core box, and the suite starts ~150 servers and workers. Each
forked child is still a process of its own, in a session of its own, running `manage.py` with its own argv,
environment, working directory and log, and exiting as the interpreter does but for its module teardown
(`leave`; the whole of it with TESTS_FULL_SHUTDOWN=1); only the
third-party imports (never this project's modules, never Django's set-up, never an event loop) were done
before. Tests that measure a cold start (readiness, the first request after a restart) start a fresh
interpreter instead (`LiveServer(..., fresh_interpreter=True)`); `TESTS_FORK_SERVERS=0` turns this off.

Run as `python -m tests.zygote SOCKET`; tests/live_server.py starts it and speaks one JSON line per connection:
`{"op": "spawn", "argv", "env", "cwd", "log", "err"?}` -> `{"pid"}`, `{"op": "status", "pid"}` -> `{"code"}` (None while
it runs; -N for a signal, as subprocess says), `{"op": "env"}` -> `{"env"}` (the environment it started with), `{"op": "ping"}`.
"""
from __future__ import annotations

import contextlib
import importlib
import json
import os
import socket
import sys
import threading
import traceback

FULL_SHUTDOWN = "TESTS_FULL_SHUTDOWN"
STARTED_ENV = dict(os.environ)  # before any import sets a variable of its own (torch sets TORCHINDUCTOR_CACHE_DIR)

# Imported before any fork: heavy, and reading nothing from the environment a test varies (the Hugging Face
# cache path is re-read in each child, below). Django's and DRF's modules that need no settings at import;
# never daphne.server nor twisted.internet.reactor (they install a reactor and an event loop).
PREIMPORTED = ("numpy", "torch", "safetensors.torch", "tokenizers", "jinja2", "huggingface_hub", "transformers",
               "transformers.modeling_utils", "transformers.generation", "transformers.models.auto.modeling_auto",
               "transformers.models.auto.tokenization_auto", "transformers.quantizers.auto",
               "transformers.processing_utils", "transformers.image_processing_utils", "torchao", "httpx",
               "django.core.management", "django.urls", "django.db.models", "django.contrib.postgres.fields",
               "rest_framework.serializers", "twisted.internet.tcp", "twisted.web.http", "redis", "channels_redis.core",
               "PIL.Image")


def preimport() -> None:
    for name in PREIMPORTED:
        with contextlib.suppress(Exception):
            importlib.import_module(name)
    if "twisted.internet.reactor" in sys.modules:  # a child must install daphne's own reactor
        raise RuntimeError("a pre-import installed a Twisted reactor")


def single_threaded() -> bool:
    """Forking is only safe while no Python thread runs here (torch's pools start lazily; OpenBLAS's, which numpy
    starts at import, stop and start again around a fork by their own atfork handlers)."""
    return threading.active_count() == 1


def rebind_hub_constants() -> None:
    """huggingface_hub reads HF_HUB_CACHE and friends at import; re-read them from this child's environment,
    also where a module copied one by name (`from ..constants import HF_HUB_CACHE`)."""
    constants = sys.modules.get("huggingface_hub.constants")
    if constants is None:
        return
    old = {name: getattr(constants, name) for name in dir(constants) if name.isupper()}
    importlib.reload(constants)
    changed = {name: getattr(constants, name) for name in old
               if hasattr(constants, name) and getattr(constants, name) != old[name]}
    for module_name, module in list(sys.modules.items()):
        if module is None or module is constants or not module_name.startswith(("huggingface_hub", "transformers")):
            continue
        for name, value in changed.items():
            if getattr(module, name, None) is old[name]:
                setattr(module, name, value)


def become(request: dict) -> None:
    """In the child (already in a session of its own): the log as stdout and stderr (`err`: stderr's own file),
    the test's environment and argv."""
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    for fd, path in ((1, request["log"]), (2, request.get("err") or request["log"])):
        file = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
        os.dup2(file, fd)
        os.close(file)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    rebind_hub_constants()
    sys.argv = list(request["argv"])
    sys.path[0] = request["cwd"]


def run_child(request: dict) -> None:
    """Run the script as `python SCRIPT ARGS` would, then leave as the interpreter does (`leave`)."""
    import runpy

    try:
        become(request)
        runpy.run_path(request["argv"][0], run_name="__main__")
    except SystemExit as exc:
        leave(exc.code)
    except BaseException:  # noqa: BLE001 - what a fresh interpreter would print before exiting 1
        traceback.print_exc()
        leave(1)
    leave(0)


def leave(code) -> None:
    """The interpreter's shutdown up to its module teardown: the threads that are not daemons joined, the atexit
    handlers run (logging's flush among them), the output flushed, then the exit status. The teardown itself
    (freeing torch's and transformers' modules: ~1.5 s of CPU a process, ~150 processes a run) is skipped,
    unless the test asks for all of it (FULL_SHUTDOWN: the graceful-stop tests, which hold a stop to exit 0)."""
    if os.environ.get(FULL_SHUTDOWN) == "1":
        sys.exit(code)
    if code is not None and not isinstance(code, int):
        print(code, file=sys.stderr)
        code = 1
    threading._shutdown()  # noqa: SLF001 - what Py_FinalizeEx does first
    import atexit

    atexit._run_exitfuncs()  # noqa: SLF001
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code or 0)


def serve(path: str) -> dict | None:
    """Answer requests until told to stop; in a forked child, return its request (the stack unwound first)."""
    finished: dict[int, int] = {}
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(16)
    listener.settimeout(5)
    parent = os.getppid()
    print("zygote ready", flush=True)
    while True:
        try:
            connection, _ = listener.accept()
        except TimeoutError:
            if os.getppid() != parent:  # the test session is gone (killed): so is its zygote
                return None
            continue
        connection.settimeout(None)
        with connection:
            request = json.loads(connection.makefile().readline())
            while True:  # reap every child that ended, so none stays a zombie
                try:
                    pid, status = os.waitpid(-1, os.WNOHANG)
                except ChildProcessError:
                    break
                if pid == 0:
                    break
                finished[pid] = os.waitstatus_to_exitcode(status)
            if request["op"] == "spawn":
                if not single_threaded():
                    connection.sendall(b'{"error": "the zygote has threads"}\n')
                    continue
                started, tell = os.pipe()
                pid = os.fork()
                if pid == 0:
                    connection.close()
                    listener.close()
                    os.close(started)
                    os.setsid()  # its own process group before the test hears its pid (the tests kill groups)
                    os.close(tell)
                    return request
                os.close(tell)
                os.read(started, 1)  # EOF once the child is in its session
                os.close(started)
                connection.sendall(json.dumps({"pid": pid}).encode() + b"\n")
            elif request["op"] == "status":
                connection.sendall(json.dumps({"code": finished.get(request["pid"])}).encode() + b"\n")
            elif request["op"] == "env":  # what it imported under (tests/live_server.py: who may fork from it)
                connection.sendall(json.dumps({"env": STARTED_ENV}).encode() + b"\n")
            elif request["op"] == "ping":
                connection.sendall(b'{"ok": true}\n')
            elif request["op"] == "exit":
                return None


if __name__ == "__main__":
    preimport()
    child = serve(sys.argv[1])
    if child is not None:
        run_child(child)
