"""Every Python snippet of the README and docs/chat-and-multimodal.md runs as written against a real `serve`
(issue 49, item 1). Only the server's address and key file differ: the snippets name 127.0.0.1:8000 and
~/.config/inference_site/8000.key, the test's server listens on a free port and writes its key elsewhere.
docs/batch.md's snippet is a sketch of the calls (it needs a requests file and waits on a batch's
completion); test_batches.py runs the same calls for real."""
import re
import subprocess
import sys
from pathlib import Path

import pytest

from .media_files import mp3_bytes, tone

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", ROOT / "docs" / "chat-and-multimodal.md"]
FENCED_PYTHON = re.compile(r"```python\n(.*?)```", re.S)
SNIPPETS = [(page, number, code) for page in PAGES
            for number, code in enumerate(FENCED_PYTHON.findall(page.read_text()), start=1)]


def pointed_at(code: str, server) -> str:
    """The snippet with the test server's address and key file in place of the default ones."""
    code = code.replace("http://127.0.0.1:8000", server.base_url)
    return code.replace('Path("~/.config/inference_site/8000.key")', f"Path({str(server.key_file)!r})")


@pytest.mark.parametrize("page,number,code", SNIPPETS,
                         ids=[f"{page.name}#{number}" for page, number, _ in SNIPPETS])
def test_snippet_runs_as_written(page, number, code, media_server, tmp_path):
    assert "127.0.0.1:8000" in code, "a snippet that names no server would not be pointed at the test's"
    (tmp_path / "talk.mp3").write_bytes(mp3_bytes(tone(1.0, 440.0)))  # the transcription snippet's recording
    done = subprocess.run([sys.executable, "-c", pointed_at(code, media_server)], cwd=tmp_path,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"{page.name} snippet {number} failed:\n{done.stderr[-3000:]}"
    assert done.stdout.strip(), "the snippet printed the model's answer"
