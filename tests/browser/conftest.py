"""Real Chromium (Debian's package, driven by Playwright) against a real server with the tiny model.

Screenshots go to $TEST_ARTIFACTS_DIR/browser (default var/test-artifacts/browser) for people to look at.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from contextlib import ExitStack, contextmanager
from pathlib import Path

import httpx
import pytest

from ..conftest import TINY_MODEL
from ..live_server import ROOT, LiveServer, base_env
from ..services import require_binary

ARTIFACTS = Path(os.environ.get("TEST_ARTIFACTS_DIR", ROOT / "var" / "test-artifacts")) / "browser"
CHROMIUM_ARGS = ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 "--no-first-run", "--disable-default-apps"]
PASSWORD = "correct-horse-battery"


@pytest.fixture(scope="module")
def chromium():
    """One headless Chromium per module (Playwright's sync API must be gone before other tests'
    event loops run); never a downloaded browser."""
    executable = require_binary("chromium", "/usr/bin/chromium", "chromium-browser")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=executable, args=CHROMIUM_ARGS)
        yield browser
        browser.close()


SECOND_MODEL = "local/tiny-llama-b"


@pytest.fixture(scope="session")
def two_model_cache(hf_cache, tmp_path_factory) -> Path:
    """The tiny model twice, as two repos (a copy of its cache folder), for two teams' allow-lists."""
    cache = tmp_path_factory.mktemp("browser-hf-cache")
    source = hf_cache / "models--local--tiny-llama"
    for name in ("models--local--tiny-llama", "models--local--tiny-llama-b"):
        shutil.copytree(source, cache / name, symlinks=True)
    return cache


def browser_server(cache: Path, work_dir: Path, thinking_template: Path, **env: str) -> LiveServer:
    """`serve` with a template that thinks when the page asks (`enable_thinking`), else answers.

    The worker is warmed up first (its first job imports torch, which on a loaded 2-core machine can
    hold the event loop past the default acknowledgement and heartbeat limits): these tests are about
    the pages, not a cold start.
    """
    env = base_env(cache, work_dir, INFERENCE_WORKER_ACK_TIMEOUT="90", INFERENCE_WORKER_LOST_AFTER="90", **env)
    live = LiveServer(env, work_dir, name="browser", extra_args=("--chat-template", str(thinking_template)))
    live.env = env
    warm_up = httpx.post(f"{live.base_url}/v1/completions", headers=live.headers, timeout=180,
                         json={"model": TINY_MODEL, "prompt": "warm up", "max_tokens": 1})
    assert warm_up.status_code == 200, warm_up.text
    return live


@pytest.fixture(scope="session")
def web_server(two_model_cache, tmp_path_factory, thinking_template):
    live = browser_server(two_model_cache, tmp_path_factory.mktemp("browser-server"), thinking_template)
    yield live
    live.stop()


def manage_shell(server: LiveServer, code: str) -> str:
    """Run Python in `manage.py shell` against the server's own database."""
    result = subprocess.run([sys.executable, "manage.py", "shell", "-v", "0", "-c", code], cwd=ROOT, env=server.env,
                            capture_output=True, text=True, check=True, timeout=120)
    return result.stdout


# Team red may use the tiny model, team blue only its copy; carol's team allows 2 requests a minute,
# tess's 3; dana's team may use both (compare mode); uma's team is used by the account page's usage test
# alone (its totals are that test's own, whatever ran before).
TEAMS = {"red": {"allowed_models": [TINY_MODEL]}, "blue": {"allowed_models": [SECOND_MODEL]},
         "slow": {"allowed_models": [TINY_MODEL], "rpm": 2}, "both": {"allowed_models": [TINY_MODEL, SECOND_MODEL]},
         "tight": {"allowed_models": [TINY_MODEL], "rpm": 3}, "metered": {"allowed_models": [TINY_MODEL]}}
# olga is an operator (staff): she may load and unload models (/load_model), the others may not;
# sam is a superuser (the admin's catalog).
MEMBERS = {"alice": "red", "bob": "blue", "carol": "slow", "dana": "both", "olga": "red", "sam": "both",
           "tess": "tight", "uma": "metered"}
STAFF = {"olga"}
SUPERUSERS = {"sam"}
MAKE_MEMBERS = """
from django.contrib.auth import get_user_model
from teams.services import add_member, create_team
teams = {{name: create_team(name, **options) for name, options in {teams!r}.items()}}
for username, team in {members!r}.items():
    user = get_user_model().objects.create_user(username, password={password!r}, is_staff=username in {staff!r},
                                                is_superuser=username in {superusers!r})
    if user.is_superuser:
        user.is_staff = True
        user.save()
    add_member(teams[team], user)
"""


def make_users(server: LiveServer) -> dict[str, str]:
    """{username: team}, every user a member of one team (the real teams services)."""
    manage_shell(server, MAKE_MEMBERS.format(teams=TEAMS, members=MEMBERS, password=PASSWORD, staff=STAFF,
                                              superusers=SUPERUSERS))
    return MEMBERS


@pytest.fixture(scope="session")
def users(web_server) -> dict[str, str]:
    return make_users(web_server)


def log_in(page, server: LiveServer, username: str) -> None:
    page.goto(f"{server.base_url}/login")
    page.fill("input[name=username]", username)
    page.fill("input[name=password]", PASSWORD)
    page.click("form button[type=submit]")
    page.wait_for_url("**/chat")
    page.wait_for_selector("body[data-ready=true]")


def screenshot(page, name: str) -> Path:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    path = ARTIFACTS / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    return path


@contextmanager
def signed_in(chromium, server: LiveServer, username: str, width: int = 1200, height: int = 800):
    """A page in a fresh browser context (its own cookies and storage) logged in as that user; the page's
    uncaught script errors collect in `page.js_errors`."""
    context = chromium.new_context(viewport={"width": width, "height": height})
    try:
        page = context.new_page()
        errors: list[str] = []
        page.on("pageerror", lambda error: errors.append(str(error)))
        page.js_errors = errors
        log_in(page, server, username)
        yield page
    finally:
        context.close()


@pytest.fixture
def page_of(chromium, web_server, users):
    """page_of(username, width=1200): a fresh browser context (its own cookies) logged in as that user."""
    with ExitStack() as pages:
        yield lambda username, width=1200, height=800: pages.enter_context(
            signed_in(chromium, web_server, username, width, height))


# A superuser made exactly as the README says, and a user in no team (the first-run and media pages' servers).
MAKE_ACCOUNTS = f"""
from django.contrib.auth import get_user_model
User = get_user_model()
User.objects.create_superuser("root", "root@example.org", {PASSWORD!r})
User.objects.create_user("newcomer", password={PASSWORD!r})
"""


@pytest.fixture(scope="session")
def media_pages_server(media_cache, tmp_path_factory):
    """One server over the media cache for the first-run and the attachment pages' tests."""
    live = media_page_server(media_cache, tmp_path_factory.mktemp("media-pages"), "media-pages")
    yield live
    live.stop()


def media_page_server(media_cache, work_dir, name: str, **env: str) -> LiveServer:
    """A server over the cache of a text, a vision and a speech model, warm, with MAKE_ACCOUNTS' users."""
    server_env = base_env(media_cache, work_dir, INFERENCE_WORKER_ACK_TIMEOUT="90", INFERENCE_WORKER_LOST_AFTER="90",
                          **env)
    live = LiveServer(server_env, work_dir, name=name)
    live.env = server_env
    warm_up = httpx.post(f"{live.base_url}/v1/completions", headers=live.headers, timeout=180,
                         json={"model": TINY_MODEL, "prompt": "warm up", "max_tokens": 1})
    assert warm_up.status_code == 200, warm_up.text
    manage_shell(live, MAKE_ACCOUNTS)
    return live
