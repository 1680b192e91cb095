"""A response's bytes go out at once where nothing is queued before them, and through Twisted's buffer where
the socket is full (inference_site/write_through.py): a real TCP connection with small buffers and Twisted's
real transport on it (its reactor never run: the test turns the transport's writes itself), every byte
arrives, in order, and a later write never overtakes queued bytes."""
from __future__ import annotations

import socket
import time

from twisted.internet import selectreactor, tcp
from twisted.internet.error import ConnectionDone
from twisted.internet.protocol import Protocol
from twisted.python.failure import Failure

from inference_site.write_through import send_now


def connection(buffer_bytes: int = 4096):
    """(Twisted's server-side transport, the client's socket, the transport's reactor) over loopback TCP, the
    server's send buffer small (a client's receive buffer below loopback's 64 KB segment would stall the window)."""
    listener = socket.create_server(("127.0.0.1", 0))
    client = socket.create_connection(listener.getsockname())  # its receive buffer as it is: a loopback window
    accepted, address = listener.accept()
    listener.close()
    accepted.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, buffer_bytes)
    accepted.setblocking(False)
    reactor = selectreactor.SelectReactor()
    return tcp.Server(accepted, Protocol(), address, None, 1, reactor), client, reactor


def queued(transport) -> bool:
    return bool(transport._tempDataBuffer) or transport.offset < len(transport.dataBuffer)


def receive(transport, client: socket.socket, total: int) -> bytes:
    """Read until `total` bytes came, letting Twisted write what it holds meanwhile (as its loop would)."""
    client.setblocking(False)
    received = bytearray()
    deadline = time.monotonic() + 20
    while len(received) < total and time.monotonic() < deadline:
        try:
            received += client.recv(1 << 16)
        except BlockingIOError:
            time.sleep(0.001)
        if queued(transport):
            assert transport.doWrite() is None
    return bytes(received)


def test_small_writes_go_out_at_once_and_the_socket_is_never_registered_for_writing():
    transport, client, reactor = connection()
    chunks = [f"data: {{\"n\": {n}}}\n\n".encode() for n in range(200)]
    for chunk in chunks:
        assert send_now(transport, chunk) == b""
        assert reactor.getWriters() == []
    assert not queued(transport)
    assert receive(transport, client, sum(map(len, chunks))) == b"".join(chunks)


def test_what_a_full_socket_leaves_is_queued_and_later_writes_wait_behind_it():
    transport, client, reactor = connection()
    data = bytes(range(256)) * 16384  # 4 MiB: far more than the buffers hold before the client reads
    rest = send_now(transport, data)
    assert 0 < len(rest) < len(data), "the socket took all or nothing: the buffers are not small"
    transport.write(rest)  # what the channel does with the rest
    assert transport in reactor.getWriters()
    later = b"data: [DONE]\n\n"
    assert send_now(transport, later) == later  # bytes are queued before it: it must not overtake them
    transport.write(later)
    assert receive(transport, client, len(data) + len(later)) == data + later
    assert not queued(transport) and reactor.getWriters() == []
    assert send_now(transport, b"next") == b""  # drained: straight out again
    assert receive(transport, client, 4) == b"next"


def test_a_closing_or_lost_connection_is_left_to_twisted():
    transport, client, _ = connection()
    transport.loseConnection()
    assert send_now(transport, b"late") == b"late"
    transport, client, _ = connection()
    client.close()
    transport.connectionLost(Failure(ConnectionDone()))
    assert send_now(transport, b"late") == b"late"


def test_the_servers_http_channel_writes_through_and_queues_only_what_is_left():
    """`serve`'s HTTP channel (inference_site/edge.py) takes this path for every response byte: its chunks reach
    the client without the socket being registered for writing, and a write the socket cannot take whole is
    finished by Twisted, in order."""
    from inference_site.edge import GuardedHTTPChannel

    transport, client, reactor = connection()
    channel = GuardedHTTPChannel()
    channel.transport = transport  # what makeConnection sets, without the edge's connection book
    chunks = [b"1a\r\n", b'data: {"text": "hi"}\n\n', b"\r\n"]
    channel.writeSequence(chunks)
    channel.write(b"0\r\n\r\n")
    assert reactor.getWriters() == [] and not queued(transport)
    big = bytes(range(256)) * 16384
    channel.write(big)
    channel.writeSequence([b"after"])
    assert transport in reactor.getWriters()
    assert receive(transport, client, 4 + 22 + 2 + 5 + len(big) + 5) == b"".join(chunks) + b"0\r\n\r\n" + big + b"after"
