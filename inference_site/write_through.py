"""A response's bytes sent at once where nothing is queued before them: one `send` a chunk, not three syscalls.

Twisted queues every write and registers the socket for writability (`epoll_ctl`), sends on the next
turn of the loop, then unregisters it (`epoll_ctl` again). A streamed answer writes one small SSE chunk
per token per stream, so that is three system calls and a loop turn for each, and every system call
hands the GIL to the engine thread and waits to take it back: in a profile of 64 streams the event
loop spent two fifths of its busy time there. asyncio's own transports try the `send` first and queue
only what the kernel did not take; this does the same in front of Twisted's buffer. Whatever is left
(a full socket buffer, an error) goes to Twisted's queue unchanged, so back-pressure on a slow reader,
producer pausing and the reporting of a lost connection stay Twisted's.
"""
from __future__ import annotations


def send_now(transport, data: bytes) -> bytes:
    """Send what the socket takes of `data` now, if nothing of the connection's is queued before it and the
    connection is a plain open TCP one; the bytes left for Twisted's queue (all of `data` otherwise)."""
    if not data or getattr(transport, "TLS", True) or not _idle_open_socket(transport):
        return data
    try:
        sent = transport.socket.send(data)
    except OSError:  # it would block, or the connection broke: Twisted's own write finds which, its way
        return data
    return data[sent:]


def _idle_open_socket(transport) -> bool:
    """Connected, not closing, and nothing queued (Twisted's two buffers empty)."""
    try:
        return (transport.connected and not transport.disconnecting and not transport._writeDisconnected
                and not transport._writeDisconnecting and not transport._tempDataBuffer
                and transport.offset == len(transport.dataBuffer) and transport.socket is not None)
    except AttributeError:  # not a twisted.internet.tcp connection: Twisted's path only
        return False
