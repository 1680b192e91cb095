"""Faults found by trying, as a new user and a hostile client would (real server, real HTTP): a body that
never arrives, model control by any key, a bad revision of a loaded model, the context-length message,
unthrottled logins and bearer-key guessing."""
from __future__ import annotations

import json
import re
import socket
import sqlite3
import time

import httpx
import pytest

from .conftest import TINY_MODEL
from .live_server import LiveServer, base_env
from .teams_setup import make_teams, manage

pytestmark = pytest.mark.timeout(300)
PROXY = "127.0.0.2"  # the guarded server believes X-Forwarded-For from this address only


def test_a_body_shorter_than_its_content_length_is_answered_408_within_seconds(server):
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as sock:
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                     b"Content-Length: 1000\r\n\r\n{\"model\":")
        started, answer = time.monotonic(), b""
        while b"\r\n\r\n" not in answer or not answer.rstrip().endswith(b"}"):
            chunk = sock.recv(65536)
            if not chunk:
                break
            answer += chunk
        elapsed = time.monotonic() - started
    assert answer.startswith(b"HTTP/1.1 408"), answer[:200]
    body = json.loads(answer.split(b"\r\n\r\n", 1)[1])
    assert body["error"]["code"] == "request_timeout"
    assert elapsed < 10, f"answered after {elapsed:.1f}s"
    assert httpx.get(f"{server.base_url}/health/live", timeout=5).status_code == 200


def test_the_context_length_error_names_the_numbers(warm_server):
    response = httpx.post(f"{warm_server.base_url}/v1/completions", headers=warm_server.headers, timeout=60,
                          json={"model": TINY_MODEL, "prompt": "Once upon a time", "max_tokens": 100000})
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["code"] == "context_length_exceeded"
    limit, asked, prompt, completion = map(int, re.search(
        r"maximum context length is (\d+) tokens. However, you requested (\d+) tokens \((\d+) in your prompt and "
        r"(\d+) for the completion\)", error["message"]).groups())
    assert asked == prompt + completion and completion == 100000
    assert f"set `max_tokens` to at most {limit - prompt}" in error["message"]
    assert "; or" not in error["message"]


@pytest.fixture(scope="module")
def guarded(hf_cache, tmp_path_factory):
    work = tmp_path_factory.mktemp("guarded")
    env = base_env(hf_cache, work, INFERENCE_BAD_KEY_LIMIT="5", INFERENCE_BAD_KEY_WINDOW="3",
                   INFERENCE_TRUSTED_PROXIES=PROXY, DJANGO_SUPERUSER_PASSWORD="right-password-1")
    live = LiveServer(env, work, name="guarded")
    live.env = env
    live.secrets = make_teams(env, teams={"small": ["--rpm", "100"]},
                              keys={"plain": ["--team", "small"], "ops": ["--team", "small", "--manage-models"]})
    manage(env, "createsuperuser", "--noinput", "--username", "boss", "--email", "boss@example.com")
    yield live
    live.stop()


def post(live: LiveServer, label: str, path: str, body: dict) -> httpx.Response:
    with httpx.stream("POST", f"{live.base_url}{path}", json=body, timeout=120,
                      headers={"Authorization": f"Bearer {live.secrets[label]}"}) as response:
        response.read()
    return response


def test_model_control_is_for_managers_only(guarded):
    for path in ("/load_model", "/unload_model"):
        refused = post(guarded, "plain", path, {"model": TINY_MODEL})
        assert refused.status_code == 403, refused.text
        assert refused.json()["error"]["code"] == "permission_denied"
        assert refused.json()["error"]["type"] == "permission_error"
    loaded = post(guarded, "ops", "/load_model", {"model": TINY_MODEL})
    assert loaded.status_code == 200 and '"ready"' in loaded.text
    assert post(guarded, "plain", "/v1/completions", {"model": TINY_MODEL, "prompt": "hi", "max_tokens": 2}).status_code == 200


def catalog_status(live: LiveServer) -> list[tuple[str, str]]:
    with sqlite3.connect(live.work_dir / "var" / "db.sqlite3") as db:
        return db.execute("select l.status, l.error from catalog_modelload l join catalog_cachedmodel m "
                          "on m.id = l.model_id where m.repo_id = ?", (TINY_MODEL,)).fetchall()


def test_a_bad_revision_of_a_served_model_leaves_it_loaded(guarded):
    assert '"ready"' in post(guarded, "ops", "/load_model", {"model": TINY_MODEL}).text
    deadline = time.monotonic() + 10
    while catalog_status(guarded) != [("loaded", "")] and time.monotonic() < deadline:
        time.sleep(0.2)
    assert catalog_status(guarded) == [("loaded", "")]
    bad = post(guarded, "ops", "/load_model", {"model": f"{TINY_MODEL}@no-such-revision"})
    events = [json.loads(line[6:]) for line in bad.text.splitlines() if line.startswith("data: {")]
    assert bad.status_code in (200, 404), bad.text
    if bad.status_code == 200:
        assert events[-1]["status"] == "error"
    time.sleep(1.0)  # the worker's model events reach the catalog
    assert catalog_status(guarded) == [("loaded", "")]
    assert post(guarded, "plain", "/v1/completions", {"model": TINY_MODEL, "prompt": "hi", "max_tokens": 2}).status_code == 200


def login(client: httpx.Client, path: str, username: str, password: str) -> httpx.Response:
    page = client.get(path)
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page.text).group(1)
    return client.post(path, data={"username": username, "password": password, "csrfmiddlewaretoken": token},
                       headers={"Referer": str(page.url)})


def test_logins_lock_out_per_user_and_per_address_until_an_admin_lifts_it(guarded):
    base = guarded.base_url
    with httpx.Client(base_url=base, timeout=30) as client:
        for _ in range(4):
            assert login(client, "/admin/login/", "boss", "wrong").status_code == 200  # the form again, with an error
        assert login(client, "/admin/login/", "boss", "wrong").status_code == 429  # the fifth failure locks
        locked = login(client, "/admin/login/", "boss", "right-password-1")
        assert locked.status_code == 429, locked.text[:300]
        assert "locked" in locked.text and "administrator" in locked.text
    manage(guarded.env, "axes_reset_username", "boss")
    with httpx.Client(base_url=base, timeout=30) as client:
        assert login(client, "/admin/login/", "boss", "right-password-1").status_code == 302
    with httpx.Client(base_url=base, timeout=30) as client:  # the pages' login: five usernames, one address
        for index in range(5):
            login(client, "/login", f"someone{index}", "wrong")
        locked = login(client, "/login", "boss", "right-password-1")
        assert locked.status_code == 429 and "locked" in locked.text
    manage(guarded.env, "axes_reset_ip", "127.0.0.1")
    with httpx.Client(base_url=base, timeout=30) as client:
        assert login(client, "/login", "boss", "right-password-1").status_code == 302


def via(source: str = "127.0.0.1") -> httpx.Client:
    """A client whose connections come from `source` (PROXY: as the trusted proxy would)."""
    return httpx.Client(transport=httpx.HTTPTransport(local_address=source), timeout=30)


def key_header(key: str, forwarded_for: str | None = None) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}", **({"X-Forwarded-For": forwarded_for} if forwarded_for else {})}


def test_wrong_bearer_keys_are_throttled_and_a_right_one_never_is(guarded):
    """Direct connections: X-Forwarded-For is not believed (a forged one changes nothing)."""
    url, right = f"{guarded.base_url}/v1/models", guarded.secrets["plain"]
    with via() as http:
        for index in range(5):
            assert http.get(url, headers=key_header(f"sk-wrong-{index}", f"198.51.100.{index}")).status_code == 401
        refused = http.get(url, headers=key_header("sk-wrong-again", "198.51.100.99"))
        assert refused.status_code == 429, refused.text
        assert refused.json()["error"]["code"] == "throttled" and int(refused.headers["Retry-After"]) >= 1
        assert http.get(url, headers=key_header(right)).status_code == 200  # the same address, a right key
        assert http.get(url, headers=key_header("sk-wrong-later")).status_code == 429  # its wrong keys still not
    time.sleep(3.5)
    with via() as http:
        assert http.get(url, headers=key_header("sk-wrong-after")).status_code == 401


def test_behind_a_trusted_proxy_each_client_is_throttled_on_its_own(guarded):
    url, right = f"{guarded.base_url}/v1/models", guarded.secrets["plain"]
    with via(PROXY) as proxy:
        for index in range(5):
            assert proxy.get(url, headers=key_header(f"sk-guess-{index}", "203.0.113.5")).status_code == 401
        assert proxy.get(url, headers=key_header("sk-guess-5", "203.0.113.5")).status_code == 429
        # Another client behind the same proxy is not the attacker; the attacker's own right key is served.
        assert proxy.get(url, headers=key_header("sk-typo", "198.51.100.7")).status_code == 401
        assert proxy.get(url, headers=key_header(right, "203.0.113.5")).status_code == 200
        # A forged hop left of the proxy's own is the client's claim: the rightmost untrusted address counts.
        assert proxy.get(url, headers=key_header("sk-guess-6", "10.9.9.9, 203.0.113.5")).status_code == 429
        # Variations of one key's visible prefix from many addresses: the prefix is throttled, the key is not.
        for index in range(5):
            assert proxy.get(url, headers=key_header(right[:12] + f"wrong{index}", f"192.0.2.{index}")).status_code == 401
        assert proxy.get(url, headers=key_header(right[:12] + "wrong9", "192.0.2.99")).status_code == 429
        assert proxy.get(url, headers=key_header(right, "192.0.2.99")).status_code == 200
    time.sleep(3.5)


def test_login_lockouts_count_the_client_behind_a_trusted_proxy(guarded):
    with httpx.Client(base_url=guarded.base_url, timeout=30, transport=httpx.HTTPTransport(local_address=PROXY),
                      headers={"X-Forwarded-For": "203.0.113.20"}) as client:
        for index in range(5):
            login(client, "/login", f"nobody{index}", "wrong")
        assert login(client, "/login", "boss", "right-password-1").status_code == 429
    with httpx.Client(base_url=guarded.base_url, timeout=30, transport=httpx.HTTPTransport(local_address=PROXY),
                      headers={"X-Forwarded-For": "203.0.113.21"}) as client:
        assert login(client, "/login", "boss", "right-password-1").status_code == 302
    manage(guarded.env, "axes_reset_ip", "203.0.113.20")
