"""Log lines written by the console handler's listener thread (inference_site.logs): every line reaches stderr
in order by the time the process exits, with its request id and traceback, and a forked child's lines too."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

CHILD = """
import logging, logging.config, os
from inference_site.logs import REQUEST_ID, logging_config

logging.config.dictConfig(logging_config("plain", "INFO"))
log = logging.getLogger("check")
REQUEST_ID.set("req-1")
for number in range(2000):
    log.info("line %d", number)
try:
    raise ValueError("the cause")
except ValueError:
    log.exception("failed")
child = os.fork()
if child == 0:
    log.info("from the child")
    logging.shutdown()
    os._exit(0)
os.waitpid(child, 0)
log.info("last line")
"""


def test_every_line_reaches_stderr_in_order_with_its_request_id_and_traceback():
    run = subprocess.run([sys.executable, "-c", CHILD], cwd=Path(__file__).resolve().parent.parent,
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    lines = run.stderr.splitlines()
    numbered = [line for line in lines if ": line " in line]
    assert [line.rsplit(" ", 1)[1] for line in numbered] == [str(n) for n in range(2000)]
    assert all("[req-1]" in line for line in numbered)
    assert "ValueError: the cause" in run.stderr and "Traceback" in run.stderr
    assert any(line.endswith("from the child") for line in lines)
    assert lines[-1].endswith("last line")


def test_a_management_command_that_aborts_leaves_its_python_stacks_on_stderr():
    """A native library's fatal error (an abort, a segfault) in `serve` or `run_worker` is said in the log with
    every thread's stack, not only as an exit code (manage.py enables faulthandler)."""
    run = subprocess.run([sys.executable, "manage.py", "shell", "-c", "import os; os.abort()"],
                         cwd=Path(__file__).resolve().parent.parent, capture_output=True, text=True, timeout=120,
                         env={**os.environ, "PYTHONFAULTHANDLER": ""})
    assert run.returncode == -6
    assert "Fatal Python error: Aborted" in run.stderr and "File \"<string>\", line 1" in run.stderr, run.stderr
