"""The first hour of a new user: `--version` names this project, and command 1's requirements.txt alone
installs every module the README's Python snippets import (issue 49, item 1)."""
import ast
import re
import subprocess
import sys
from importlib.metadata import packages_distributions
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FENCED_PYTHON = re.compile(r"```python\n(.*?)```", re.S)


def pinned_names(requirements: Path) -> set[str]:
    """The distribution names a requirements file pins (normalised), without following -r."""
    names = set()
    for line in requirements.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line and not line.startswith("-"):
            names.add(re.split(r"[=<>\[ ;]", line, maxsplit=1)[0].lower().replace("_", "-"))
    return names


def imported_top_modules(source: str) -> set[str]:
    """The top-level modules a snippet imports."""
    modules = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            modules.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            modules.add(node.module.split(".")[0])
    return modules


@pytest.mark.parametrize("command", ["serve", "run_worker", "client"])
def test_version_names_the_project_not_django(command):
    from inference_site import __version__

    done = subprocess.run([sys.executable, "manage.py", command, "--version"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().startswith(f"inference-site {__version__}")


def test_readme_snippets_need_only_requirements_txt():
    runtime = pinned_names(ROOT / "requirements.txt")
    distributions = packages_distributions()
    snippets = FENCED_PYTHON.findall((ROOT / "README.md").read_text())
    assert snippets, "the README has a Python snippet"
    missing = {}
    for module in set().union(*(imported_top_modules(snippet) for snippet in snippets)):
        if module in sys.stdlib_module_names:
            continue
        owners = {name.lower().replace("_", "-") for name in distributions.get(module, [])}
        if not owners & runtime:
            missing[module] = sorted(owners) or ["not installed"]
    assert not missing, f"README snippets import modules requirements.txt does not install: {missing}"
