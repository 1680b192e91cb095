"""Every Python snippet of the README and docs/ runs as written against a real `serve` (issue 49): a new
user copies them first, so a snippet that fails is the first thing they see.

Each snippet runs in a fresh Python process, in the order of its page, against the media server (the tiny
text, vision and Whisper models the docs name); the only edits are the server's address and key file,
which the docs give as port 8000's. A page that says its `client` is the README's gets the README's first
snippet run before it."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.live_server import ROOT

PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^```python\n(.*?)^```$", re.DOTALL | re.MULTILINE)
README_CLIENT = "the SDK client of the [README]"


def python_snippets(page: Path) -> list[tuple[int, str]]:
    """(line number, code) of each ```python block of a page."""
    text = page.read_text()
    return [(text.count("\n", 0, match.start()) + 1, match.group(1)) for match in FENCE.finditer(text)]


SNIPPETS = [(page, line, code) for page in PAGES for line, code in python_snippets(page)]
SNIPPET_IDS = [f"{page.relative_to(ROOT)}:{line}" for page, line, _ in SNIPPETS]


def test_the_docs_hold_the_snippets_this_test_runs():
    """The extraction finds the README's first request and the media examples (a changed fence would
    otherwise make every test below pass over nothing)."""
    names = set(SNIPPET_IDS)
    assert any(name.startswith("README.md:") for name in names)
    assert any(name.startswith("docs/batch.md:") for name in names)
    assert sum(name.startswith("docs/chat-and-multimodal.md:") for name in names) >= 3


@pytest.mark.parametrize(("page", "line", "code"), SNIPPETS, ids=SNIPPET_IDS)
def test_every_snippet_compiles(page, line, code):
    compile(code, f"{page.name}:{line}", "exec")


def as_run_here(code: str, server) -> str:
    """The snippet pointed at this test's server instead of port 8000's."""
    return (code.replace("http://127.0.0.1:8000", server.base_url)
                .replace('"~/.config/inference_site/8000.key"', repr(str(server.key_file))))


@pytest.mark.timeout(600)
@pytest.mark.parametrize(("page", "line", "code"), SNIPPETS, ids=SNIPPET_IDS)
def test_every_snippet_runs_against_a_real_server(page, line, code, media_server, tmp_path):
    readme_first = python_snippets(ROOT / "README.md")[0][1]
    preamble = readme_first if README_CLIENT in page.read_text() else ""
    # As a user's shell runs it: the tests' own offline switch would stop huggingface_hub's client (a snippet
    # uses it) from reaching even the local server.
    env = {name: value for name, value in os.environ.items() if name != "HF_HUB_OFFLINE"}
    result = subprocess.run([sys.executable, "-c", as_run_here(preamble + "\n" + code, media_server)],
                            cwd=tmp_path, capture_output=True, text=True, timeout=300, env=env)
    assert result.returncode == 0, f"{page.name}:{line} failed:\n{result.stderr[-3000:]}"
    assert result.stdout.strip(), f"{page.name}:{line} printed nothing"
