"""`manage.py client` as a user runs it: a subprocess against the live server, stdin piped or not."""
from __future__ import annotations

import os
import subprocess
import sys

from .conftest import TINY_MODEL
from .live_server import ROOT


def run_client(server, *args: str, stdin: str | None = None, key_from: str = "file") -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("OPENAI_API_KEY", "INFERENCE_API_KEY")}
    env.update(INFERENCE_KEY_DIR=str(server.key_file.parent), DJANGO_SETTINGS_MODULE="inference_site.settings",
               INFERENCE_VAR_DIR=str(server.work_dir / "client-var"), HF_HUB_OFFLINE="1")
    if key_from == "env":
        env["OPENAI_API_KEY"] = server.key
        env["INFERENCE_KEY_DIR"] = str(server.work_dir / "no-keys-here")
    return subprocess.run([sys.executable, "manage.py", "client", "--url", f"{server.base_url}/v1", *args],
                          input=stdin if stdin is not None else "", capture_output=True, text=True, cwd=ROOT,
                          timeout=120, env=env)


def test_piped_prompt_is_completed_with_echo(server, client):
    result = run_client(server, "--max-tokens", "8", "--temperature", "0", stdin="Once upon a time\n")
    assert result.returncode == 0, result.stderr
    expected = client.completions.create(model=TINY_MODEL, prompt="Once upon a time", max_tokens=8, temperature=0)
    assert result.stdout == "Once upon a time" + expected.choices[0].text + "\n"


def test_completion_flag_streams_without_echo(server, client):
    result = run_client(server, "--completion", "The capital of France is", "--no-echo", "--stream",
                        "--max-tokens", "6", "--temperature", "0", "--show-usage")
    expected = client.completions.create(model=TINY_MODEL, prompt="The capital of France is", max_tokens=6,
                                         temperature=0)
    assert result.stdout == expected.choices[0].text + "\n"
    assert "completion 6" in result.stderr


def test_one_chat_message_streamed_or_not_prints_the_answer(server, client):
    expected = client.chat.completions.create(model=TINY_MODEL, messages=[{"role": "user", "content": "Hi"}],
                                              max_tokens=6, temperature=0).choices[0].message.content or ""
    for extra in ((), ("--stream",)):
        result = run_client(server, "--message", "Hi", "--max-tokens", "6", "--temperature", "0", *extra,
                            key_from="env")
        assert result.returncode == 0, result.stderr
        assert result.stdout == expected + "\n"


def test_models_health_and_a_bad_key(server):
    assert run_client(server, "--list-models").stdout.split() == [TINY_MODEL]
    assert '"ok"' in run_client(server, "--health").stdout
    bad = run_client(server, "--api-key", "wrong", "--message", "hi")
    assert bad.returncode != 0 and "401" in bad.stderr and "Traceback" not in bad.stderr


def test_interactive_chat_without_max_tokens_stays_within_the_context(warm_server):
    server = warm_server
    """Each reply is capped to the room the conversation leaves; old turns go when it is full (512 tokens)."""
    env = {k: v for k, v in os.environ.items() if k not in ("OPENAI_API_KEY", "INFERENCE_API_KEY")}
    env.update(INFERENCE_KEY_DIR=str(server.key_file.parent), DJANGO_SETTINGS_MODULE="inference_site.settings",
               INFERENCE_VAR_DIR=str(server.work_dir / "client-var"), HF_HUB_OFFLINE="1")
    terminal, tty = os.openpty()  # the interactive mode needs a terminal on stdin
    process = subprocess.Popen([sys.executable, "manage.py", "client", "--url", f"{server.base_url}/v1",
                                "--temperature", "0", "--show-usage"],
                               stdin=tty, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=ROOT, env=env, text=True)
    os.close(tty)
    os.write(terminal, b"".join(b"turn %d: tell me a long story\n" % i for i in range(5)) + b"quit\n")
    try:
        out, err = process.communicate(timeout=300)
    finally:
        os.close(terminal)
    assert process.returncode == 0, err
    assert "error" not in err and "Traceback" not in err, err
    usages = [line for line in err.splitlines() if line.startswith("[usage]")]
    assert len(usages) == 5, err
    assert all(int(line.split("=")[1].split()[0]) <= 512 for line in usages)
