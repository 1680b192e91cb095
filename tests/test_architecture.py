"""The layering of the design card, as import-linter contracts (.importlinter): CI fails when an import breaks it."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from .live_server import ROOT


def test_the_import_contracts_hold():
    lint_imports = Path(sys.executable).with_name("lint-imports")
    result = subprocess.run([str(lint_imports), "--no-cache"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout
