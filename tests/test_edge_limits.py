"""The edge of `serve` under a hostile client (real server, real sockets): connections that never finish
their headers, sit idle or drip a body are closed after their timeouts, one address holds no more than
its cap, the process never runs out of file descriptors however many are attempted, and a normal
request keeps answering throughout. The attacker connects from 127.0.0.2..., the normal client from
127.0.0.1 (Linux routes all of 127/8 to loopback)."""
from __future__ import annotations

import os
import socket
import time
from pathlib import Path

import httpx
import pytest

from .live_server import LiveServer, base_env

pytestmark = pytest.mark.timeout(180)
PER_ADDRESS = 20
HEADER_TIMEOUT = 1.0
KEEPALIVE_TIMEOUT = 1.5
HALF_REQUEST = b"GET /health/live HTTP/1.1\r\nHost: 127.0.0.1\r\n"  # the blank line that ends the headers never comes


def connect(port: int, source: str, timeout: float = 5.0) -> socket.socket:
    return socket.create_connection(("127.0.0.1", port), timeout=timeout, source_address=(source, 0))


def fate(sock: socket.socket, within: float) -> str:
    """What became of a connection within `within` seconds: "408", "closed" (FIN or reset), or "open"."""
    sock.settimeout(within)
    try:
        data = sock.recv(4096)
    except (TimeoutError, socket.timeout):
        return "open"
    except OSError:
        return "closed"
    return "408" if data.startswith(b"HTTP/1.1 408") else "closed" if not data else data[:40].decode("latin-1")


def normal_request(live: LiveServer) -> float:
    started = time.monotonic()
    response = httpx.get(f"{live.base_url}/v1/models", headers=live.headers, timeout=10)
    assert response.status_code == 200, response.text
    return time.monotonic() - started


def open_descriptors(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


@pytest.fixture(scope="module")
def edge(hf_cache, tmp_path_factory):
    work = tmp_path_factory.mktemp("edge")
    env = base_env(hf_cache, work, INFERENCE_HEADER_TIMEOUT=str(HEADER_TIMEOUT),
                   INFERENCE_KEEPALIVE_TIMEOUT=str(KEEPALIVE_TIMEOUT), INFERENCE_BODY_READ_TIMEOUT="1",
                   INFERENCE_MIN_BODY_RATE="100", INFERENCE_MAX_CONNECTIONS_PER_ADDRESS=str(PER_ADDRESS))
    live = LiveServer(env, work, name="edge")
    yield live
    live.stop()


def test_header_incomplete_connections_are_capped_per_address_and_timed_out(edge):
    attacker = [connect(edge.port, "127.0.0.2") for _ in range(PER_ADDRESS + 10)]
    for sock in attacker:
        try:
            sock.sendall(HALF_REQUEST)
        except OSError:
            pass  # one refused as it was accepted may already be reset
    started = time.monotonic()
    beyond = [fate(sock, 0.5) for sock in attacker[PER_ADDRESS:]]
    assert beyond == ["closed"] * 10  # past the cap: closed at once, unread
    assert normal_request(edge) < 1.0  # another address is served meanwhile
    held = [fate(sock, HEADER_TIMEOUT + 3) for sock in attacker[:PER_ADDRESS]]
    waited = time.monotonic() - started
    assert held == ["408"] * PER_ADDRESS, held
    assert waited < HEADER_TIMEOUT + 3
    for sock in attacker:
        sock.close()
    time.sleep(0.2)
    # The address's connections are counted down again: it may connect and be served.
    with connect(edge.port, "127.0.0.2") as sock:
        sock.sendall(HALF_REQUEST + b"\r\n")
        assert fate(sock, 5).startswith("HTTP/1.1 200")
    assert "request headers did not arrive" in edge.log() and "refusing connections from 127.0.0.2" in edge.log()


def test_idle_keepalive_connections_are_closed(edge):
    idle = [connect(edge.port, "127.0.0.3") for _ in range(PER_ADDRESS)]
    for sock in idle:
        sock.sendall(HALF_REQUEST + b"\r\n")
        assert fate(sock, 5).startswith("HTTP/1.1 200")  # served, and kept alive
    started = time.monotonic()
    assert [fate(sock, KEEPALIVE_TIMEOUT + 3) for sock in idle] == ["closed"] * PER_ADDRESS
    assert time.monotonic() - started < KEEPALIVE_TIMEOUT + 3
    assert normal_request(edge) < 1.0
    for sock in idle:
        sock.close()


def test_a_body_that_drips_is_408_and_an_oversize_one_413_before_it_is_sent(edge):
    with connect(edge.port, "127.0.0.4") as sock:
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                     b"Content-Length: 5000\r\n\r\n{")
        started, answer = time.monotonic(), b""
        sock.settimeout(0.3)
        while not answer and time.monotonic() - started < 10:
            try:
                sock.sendall(b" ")  # a byte every 0.3 s: never silent for BODY_READ_TIMEOUT, far below the rate
                answer = sock.recv(4096)
            except (TimeoutError, socket.timeout):
                continue
            except OSError:
                break
        assert answer.startswith(b"HTTP/1.1 408"), answer[:200]
        assert b"below the minimum" in answer and time.monotonic() - started < 4
    with connect(edge.port, "127.0.0.4") as sock:
        started = time.monotonic()
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 3000000\r\n\r\n")
        answer = sock.recv(4096)
        assert answer.startswith(b"HTTP/1.1 413") and b"request_too_large" in answer, answer[:200]
        assert time.monotonic() - started < 1.0


def test_descriptors_stay_below_the_limit_with_twice_the_cap_attempted(hf_cache, tmp_path):
    """`ulimit -n 256` in the server's shell; the edge keeps 64 for itself: 192 for connections. 384 are
    attempted from four addresses; a normal client is still served, and the process never hits the limit."""
    limit, reserve = 256, 64
    env = base_env(hf_cache, tmp_path, INFERENCE_FD_RESERVE=str(reserve), INFERENCE_HEADER_TIMEOUT="30")
    live = LiveServer(env, tmp_path, name="fd-limit", launcher=("bash", "-c", f'ulimit -n {limit} && exec "$@"', "sh"))
    attackers: list[socket.socket] = []
    try:
        assert f"at most {limit - reserve} descriptors" in live.log()
        assert normal_request(live) < 5.0
        most = 0
        for index in range(2 * (limit - reserve)):
            try:
                sock = connect(live.port, f"127.0.0.{2 + index % 4}")
                sock.sendall(HALF_REQUEST)
                attackers.append(sock)
            except OSError:
                pass
            if index % 32 == 0:
                most = max(most, open_descriptors(live.process.pid))
        time.sleep(0.5)
        most = max(most, open_descriptors(live.process.pid))
        timings = [normal_request(live) for _ in range(5)]  # each takes the place of the longest-waiting attacker
        most = max(most, open_descriptors(live.process.pid))
        print(f"most descriptors open: {most} of {limit}; normal requests took {max(timings):.2f}s at most")
        assert most < limit
        assert max(timings) < 1.0
        assert "Too many open files" not in live.log()
        assert "closing the connections that waited longest" in live.log()
        assert Path(f"/proc/{live.process.pid}").exists()
    finally:
        for sock in attackers:
            sock.close()
        live.stop()
