"""The edge of `serve`: which connections Daphne (Twisted) keeps, for how long, and how many.

Twisted's only clock on a connection is its idle timeout, which every byte restarts: a client that
sends a header line now and then, or a body a byte at a time, holds its connection (and a file
descriptor) as long as it likes, and nothing bounds how many connections one address, or all of
them, may hold — 21,000 half-sent requests used up the process's open files. Here, per connection:

- HEADER_TIMEOUT: a request line and headers must all arrive within this many seconds (counted from
  the connection's start for its first request, from the first byte for later ones), else a 408
  (or, when nothing at all came, a silent close) — checked by one sweep over the waiting connections,
  oldest first, not a timer each.
- KEEPALIVE_TIMEOUT: an idle connection between requests is closed (Twisted's own idle timeout,
  `HTTPFactory.timeOut`; Twisted switches it off while a request is handled).
- a body: nothing for BODY_READ_TIMEOUT seconds, or, after those, an average below MIN_BODY_RATE
  bytes/s, is a 408; a declared `Content-Length` over the path's limit is a 413 before any of the body
  is read (and a chunked body is cut off with a 413 once it passes the limit).

And for the server as a whole (the factory): a client address (an IPv6 /64; trusted proxies exempt,
every client behind them shares their address) holds at most MAX_CONNECTIONS_PER_ADDRESS connections,
and connections together with the request bodies they spool to disk hold at most MAX_CONNECTIONS
file descriptors (default: the open-file limit less FD_RESERVE, left for the database, the channel
layer, the ledger's spool and model files). A connection past the address cap is closed as it is
accepted, unread: the cheapest refusal there is. At the global cap a new connection takes the place of
the one that has waited longest for its headers or its next request (a slow-headers attacker's,
most likely); only when every connection is inside a request is the new one closed. Requests under
way are never touched. Twisted's own `LimitConnectionsByPeer` and `LimitTotalConnectionsFactory`
wrap every byte in a ProtocolWrapper and cannot evict; the former indexes addresses as tuples, which
Twisted's address objects no longer are.
"""
from __future__ import annotations

import asyncio
import logging
import resource
import time
from collections import OrderedDict
from dataclasses import dataclass

import daphne.server
from daphne.http_protocol import HTTPFactory
from twisted.web.http import HTTPChannel, _GenericHTTPChannelProtocol

from openai_api.metrics import observe_http
from protocol.burst_log import BurstLog
from teams.client_address import Network, address_bucket, in_networks, parse_networks

from .admission import GENERATION_PATHS, RETRY_AFTER_SECONDS, AdmissionLimit
from .http_limits import PARSER_LIMIT, UnparsedBodyWebRequest, bad_request, line_too_long, refuse
from .inference_settings import InferenceSettings
from .write_through import send_now

logger = logging.getLogger(__name__)
refusals = BurstLog(logger)
SWEEP_SECONDS = 0.25
BODY_CHECK_SECONDS = 0.5
DOOR_PATHS = frozenset(path.encode() for path in GENERATION_PATHS)
EVICTING = 16  # connections closed for new ones, at most, whose descriptors are not given back yet
IN_MEMORY_BODY = 100_000  # Twisted keeps a body below this in memory; a larger one (or chunked) takes a file


@dataclass(frozen=True)
class EdgeConfig:
    header_timeout: float
    keepalive_timeout: float
    body_read_timeout: float
    min_body_rate: int
    max_per_address: int  # 0: no cap
    max_connections: int  # file descriptors for connections and spooled bodies
    max_request_bytes: int
    max_upload_bytes: int  # POST /v1/files
    trusted: tuple[Network, ...]
    django_paths: tuple[bytes, ...]  # the admin and pages: Django's own body limits apply
    shutdown_grace: float = 10.0  # SIGINT/SIGTERM: streams in flight run on this long (inference_site/graceful_stop.py)

    @classmethod
    def from_settings(cls, inference: InferenceSettings, full_stack_paths: tuple[str, ...]) -> EdgeConfig:
        """The edge's settings group as `serve` runs it: the descriptor cap fitted to this process's open-file
        limit, the trusted networks parsed, the uploads' own limit beside the API's."""
        edge = inference.edge
        return cls(
            header_timeout=edge.header_timeout, keepalive_timeout=edge.keepalive_timeout,
            body_read_timeout=edge.body_read_timeout, min_body_rate=edge.min_body_rate,
            max_per_address=edge.max_connections_per_address,
            max_connections=edge.max_connections or descriptor_budget(edge.fd_reserve),
            max_request_bytes=inference.api.max_request_bytes,
            max_upload_bytes=inference.batches.file_max_bytes + 64 * 1024,
            trusted=parse_networks(inference.teams.trusted_proxies),
            django_paths=tuple(path.encode() for path in full_stack_paths),
            shutdown_grace=inference.lifecycle.shutdown_grace_seconds)

    def body_limit(self, method: bytes, path: bytes) -> int | None:
        """The most a request's body may declare at the edge (None: Django's own limits, the admin's forms)."""
        path = path.split(b"?", 1)[0]
        if path.startswith(self.django_paths):
            return None
        if method == b"POST" and path == b"/v1/files":
            return self.max_upload_bytes
        return self.max_request_bytes


def raise_open_file_limit() -> int:
    """Raise this process's soft open-file limit to its hard one (as Go's runtime does at start); the limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard and (hard == resource.RLIM_INFINITY or soft < hard):
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
        except (ValueError, OSError):
            pass
    return soft


def descriptor_budget(reserve: int) -> int:
    """File descriptors the edge may hold: the open-file limit less `reserve` (at least 16)."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        soft = 1 << 20
    return max(16, soft - reserve)


class ConnectionBook:
    """The server's open connections: descriptors in use, connections per address, and which wait."""

    def __init__(self, config: EdgeConfig, door: AdmissionLimit | None = None) -> None:
        self.config = config
        self.door = door  # generation requests past it are refused as their last byte arrives
        self.descriptors = 0  # connections + spooled request bodies
        self.by_address: dict[str, int] = {}
        self.waiting: OrderedDict[GuardedHTTPChannel, float] = OrderedDict()  # for a request's headers, since
        self.idle: OrderedDict[GuardedHTTPChannel, None] = OrderedDict()  # between requests
        self.evicting = 0  # evicted, their descriptors not given back yet

    def admit(self, host: str) -> tuple[bool, str | None]:
        """Whether a new connection from `host` is taken, and the address bucket it counts in (None: a
        trusted proxy's)."""
        bucket = None if in_networks(host, self.config.trusted) else address_bucket(host)
        if bucket is not None and self.config.max_per_address and \
                self.by_address.get(bucket, 0) >= self.config.max_per_address:
            refusals.note("address", "refusing connections from %s: it holds %d already "
                                     "(INFERENCE_MAX_CONNECTIONS_PER_ADDRESS)", bucket, self.config.max_per_address)
            return False, bucket
        if self.descriptors >= self.config.max_connections and not self._evict_one():
            refusals.note("full", "refusing a connection: %d descriptors in use by requests under way "
                                  "(INFERENCE_MAX_CONNECTIONS)", self.descriptors)
            return False, bucket
        self.descriptors += 1
        if bucket is not None:
            self.by_address[bucket] = self.by_address.get(bucket, 0) + 1
        return True, bucket

    def _evict_one(self) -> bool:
        """Close the connection that has waited longest for its headers, else the longest idle one.

        A closed connection gives its descriptor back only at the loop's next turn, and a turn accepts
        up to ACCEPTS_PER_TURN: at most EVICTING connections are closing at once, so the descriptors in use
        pass the cap by no more than that (FD_RESERVE holds it); past it a new connection is refused."""
        if self.evicting >= EVICTING:
            return False
        for queue in (self.waiting, self.idle):
            if queue:
                victim, _ = queue.popitem(last=False)
                self.evicting += 1
                refusals.note("evict", "at %d descriptors (INFERENCE_MAX_CONNECTIONS): closing the connections "
                                       "that waited longest for a request to admit new ones", self.descriptors)
                victim.evict()
                return True
        return False

    def take_file(self) -> bool:
        if self.descriptors >= self.config.max_connections:
            return False
        self.descriptors += 1
        return True

    def release_file(self) -> None:
        self.descriptors -= 1

    def wait_for_request(self, channel: GuardedHTTPChannel) -> None:
        self.idle.pop(channel, None)
        self.waiting[channel] = time.monotonic()

    def keep_idle(self, channel: GuardedHTTPChannel) -> None:
        self.waiting.pop(channel, None)
        self.idle[channel] = None

    def busy(self, channel: GuardedHTTPChannel) -> None:
        self.waiting.pop(channel, None)
        self.idle.pop(channel, None)

    def forget(self, channel: GuardedHTTPChannel) -> None:
        self.busy(channel)
        self.descriptors -= 1
        if channel.evicted:
            self.evicting -= 1
        if channel.bucket is not None:
            left = self.by_address[channel.bucket] - 1
            if left:
                self.by_address[channel.bucket] = left
            else:
                del self.by_address[channel.bucket]

    def sweep(self) -> None:
        """Time out the connections whose headers are late (the oldest first; the rest are younger)."""
        deadline = time.monotonic() - self.config.header_timeout
        while self.waiting:
            channel, since = next(iter(self.waiting.items()))
            if since > deadline:
                return
            del self.waiting[channel]
            channel.headers_timed_out()


class GuardedHTTPChannel(HTTPChannel):
    """Twisted's HTTP/1.1 channel with the edge's clocks, and its refusals in OpenAI's shape (http_limits)."""

    MAX_LENGTH = PARSER_LIMIT
    totalHeadersSize = PARSER_LIMIT
    book: ConnectionBook
    bucket: str | None = None
    heard = False  # a byte of the awaited request arrived
    finished_with = False  # refused or evicted: the book has let it go
    evicted = False
    _body_check = None
    _body_limit: int | None = None
    _in_door = False  # counted in the door's requests in flight until its response is done

    def connectionMade(self) -> None:
        super().connectionMade()
        self.book.wait_for_request(self)

    def write(self, data: bytes) -> None:
        rest = send_now(self.transport, data)  # inference_site/write_through.py
        if rest:
            super().write(rest)

    def writeSequence(self, iovec) -> None:
        rest = send_now(self.transport, b"".join(iovec))
        if rest:
            super().writeSequence([rest])

    def connectionLost(self, reason) -> None:
        self._stop_body_clock()
        super().connectionLost(reason)
        self._leave_door()
        self.book.forget(self)

    def dataReceived(self, data: bytes) -> None:
        if self in self.book.idle:  # the next request begins: its headers have HEADER_TIMEOUT from now
            self.book.wait_for_request(self)
        self.heard = True
        super().dataReceived(data)

    def lineLengthExceeded(self, line: bytes) -> None:
        self._let_go()
        line_too_long(self, line)

    def _respondToBadRequestAndDisconnect(self) -> None:
        self._let_go()
        bad_request(self)

    def allHeadersReceived(self) -> None:
        self.book.busy(self)
        limit = self.book.config.body_limit(self._command, self._path)
        if limit is not None and self.length and self.length > limit:
            return self.refuse(413, f"Request body too large: Content-Length is {self.length} bytes; the limit is "
                                    f"{limit} bytes.", "request_too_large")
        if self.length != 0:  # a body follows (None: chunked)
            if (self.length is None or self.length >= IN_MEMORY_BODY) and not self.book.take_file():
                return self.refuse(503, "The server is at capacity: too many requests are uploading at once. "
                                        "Retry shortly.", "server_busy")
            self._spooled = self.length is None or self.length >= IN_MEMORY_BODY
            self._body_limit = limit
            self._start_body_clock()
        super().allHeadersReceived()

    def rawDataReceived(self, data: bytes) -> None:
        if self._body_check is not None:
            self._body_bytes += len(data)
            self._body_last = time.monotonic()
            if self._body_limit is not None and self._body_bytes > self._body_limit + 64 * 1024:  # chunk framing
                return self.refuse(413, f"Request body too large: the limit is {self._body_limit} bytes.",
                                   "request_too_large")
        super().rawDataReceived(data)

    def allContentReceived(self) -> None:
        self._stop_body_clock()
        door = self.book.door
        if door is not None and self._command == b"POST" and self._path.split(b"?", 1)[0] in DOOR_PATHS:
            refused = door.enter()
            if refused is not None:
                code, message = refused
                authorization = (self.requests[-1].requestHeaders.getRawHeaders(b"authorization") or [b""])[0]
                path = self._path.split(b"?", 1)[0].decode("latin-1")
                self.refuse(503, message, code, {"Retry-After": str(RETRY_AFTER_SECONDS)})
                door.refused(path, authorization, code)
                observe_http(path, "POST", 503, 0.0)  # no access line each: the door logs once per burst
                return
            self._in_door = True
        super().allContentReceived()

    def _leave_door(self) -> None:
        if self._in_door:
            self._in_door = False
            self.book.door.leave()

    def requestDone(self, request) -> None:
        self._leave_door()
        if self.persistent and not self.finished_with:
            self.heard = False
            self.book.keep_idle(self)  # before the base class replays what was pipelined behind it
        super().requestDone(request)

    def timeoutConnection(self) -> None:
        if self._body_check is not None:
            return self._body_timed_out(f"nothing for {self.timeOut:g}s")
        super().timeoutConnection()

    # --- the edge's own decisions ---------------------------------------------
    def refuse(self, status: int, message: str, code: str, headers: dict[str, str] | None = None) -> None:
        self._let_go()
        refuse(self, status, message, code, headers)

    def headers_timed_out(self) -> None:
        """HEADER_TIMEOUT passed without a whole request line and headers: 408 (closed without a word if
        nothing came at all, as a connection opened ahead of need may be)."""
        self._let_go()
        if not self.heard:
            self.transport.loseConnection()
            return
        refusals.note("headers", "closing connections whose request headers did not arrive within %gs "
                                 "(INFERENCE_HEADER_TIMEOUT)", self.book.config.header_timeout)
        refuse(self, 408, f"The request headers did not arrive within {self.book.config.header_timeout:g}s.",
               "request_timeout")
        self.transport.loseConnection()  # no waiting for a client this slow to read the answer

    def evict(self) -> None:
        self.evicted = self.finished_with = True
        self._stop_body_clock()
        self.transport.abortConnection()

    def _let_go(self) -> None:
        self.finished_with = True
        self.book.busy(self)
        self._stop_body_clock()

    def _start_body_clock(self) -> None:
        self._body_started = self._body_last = time.monotonic()
        self._body_bytes = 0
        self._body_check = self.callLater(BODY_CHECK_SECONDS, self._check_body)

    def _stop_body_clock(self) -> None:
        if self._body_check is not None:
            if self._body_check.active():
                self._body_check.cancel()
            self._body_check = None

    def _check_body(self) -> None:
        config, now = self.book.config, time.monotonic()
        elapsed = now - self._body_started
        if now - self._body_last >= config.body_read_timeout:
            return self._body_timed_out(f"nothing for {config.body_read_timeout:g}s")
        if elapsed >= config.body_read_timeout and self._body_bytes < config.min_body_rate * elapsed:
            return self._body_timed_out(f"{self._body_bytes / elapsed:.0f} bytes/s over {elapsed:.0f}s, below the "
                                        f"minimum of {config.min_body_rate}")
        self._body_check = self.callLater(BODY_CHECK_SECONDS, self._check_body)

    def _body_timed_out(self, why: str) -> None:
        self._body_check = None
        refusals.note("body", "answering 408 to request bodies that arrive too slowly (%s)", why)
        self.refuse(408, f"The request body did not arrive: {why} with bytes still missing "
                         "(is Content-Length larger than the body?).", "request_timeout")


class EdgeRequest(UnparsedBodyWebRequest):
    """A request whose spooled body file counts against the book's descriptors until it is closed."""

    def gotLength(self, length: int | None) -> None:
        super().gotLength(length)
        if getattr(self.channel, "_spooled", False):
            self.channel._spooled = False
            self.content = CountedFile(self.content, self.channel.book)


class CountedFile:
    """A request body's temporary file that gives its descriptor back to the book when closed."""

    def __init__(self, file, book: ConnectionBook) -> None:
        self._file = file
        self._book = book

    def __getattr__(self, name: str):
        return getattr(self._file, name)

    def close(self) -> None:
        if not self._file.closed:
            self._file.close()
            self._book.release_file()


class EdgeHTTPFactory(HTTPFactory):
    """Daphne's factory with the connection book: caps at accept, the edge's channel, the sweep."""

    book: ConnectionBook

    def __init__(self, server) -> None:
        super().__init__(server)
        self.timeOut = edge_config().keepalive_timeout
        self.book = ConnectionBook(edge_config(), _door)
        self._sweeping = None

    def protocol(self) -> _GenericHTTPChannelProtocol:  # Twisted's factory calls `self.protocol()`
        return _GenericHTTPChannelProtocol(GuardedHTTPChannel())

    def startFactory(self) -> None:
        super().startFactory()
        self._sweep()

    def stopFactory(self) -> None:
        if self._sweeping is not None and self._sweeping.active():
            self._sweeping.cancel()
        super().stopFactory()

    def _sweep(self) -> None:
        try:
            self.book.sweep()
        finally:
            self._sweeping = self.reactor.callLater(SWEEP_SECONDS, self._sweep)

    def buildProtocol(self, addr):
        admitted, bucket = self.book.admit(getattr(addr, "host", ""))
        if not admitted:
            return None  # Twisted closes the socket it accepted, unread
        protocol = super().buildProtocol(addr)
        protocol.requestFactory = EdgeRequest
        channel = protocol._channel
        channel.book, channel.bucket = self.book, bucket
        return protocol


class EdgeServer(daphne.server.Server):
    """Daphne's server whose listening ports accept a burst whole. Twisted's port accepts as many
    connections per turn of the loop as it did the turn before, plus 20: after a quiet spell that is one,
    and 800 clients arriving at once took nine turns, each as long as the requests already admitted made
    it (seconds, on a loaded box, before a refusal was even read)."""

    def kill_all_applications(self):
        """A graceful stop first (inference_site/graceful_stop.py), then Daphne's: it cancels what is left."""
        from twisted.internet import defer

        from inference_site.graceful_stop import stop_gracefully

        async def stop() -> None:
            if _door is not None:
                try:
                    await stop_gracefully(_door, edge_config().shutdown_grace)
                except Exception:
                    logger.exception("the graceful stop failed; closing what is left")
            await defer.Deferred.asFuture(super(EdgeServer, self).kill_all_applications(),
                                          asyncio.get_running_loop())

        return defer.Deferred.fromFuture(asyncio.ensure_future(stop()))

    def listen_success(self, port) -> None:
        read = port.doRead

        def read_a_burst() -> None:
            port.numberAccepts = max(port.numberAccepts, ACCEPTS_PER_TURN)
            read()

        port.doRead = read_a_burst
        super().listen_success(port)


ACCEPTS_PER_TURN = 1024  # accept() stops early once the backlog is empty
_config: EdgeConfig | None = None
_door: AdmissionLimit | None = None


def keep_the_door(door: AdmissionLimit) -> None:
    """The edge counts and refuses generation requests for `door` (the ASGI middleware then lets them by)."""
    global _door
    _door = door
    door.at_the_edge = True


def edge_config() -> EdgeConfig:
    global _config
    if _config is None:
        from django.conf import settings

        _config = EdgeConfig.from_settings(settings.INFERENCE, settings.FULL_STACK_PATHS)
    return _config


def install() -> EdgeConfig:
    """Raise the open-file limit, fix the edge's settings, and make daphne.server.Server build EdgeHTTPFactory
    (it names HTTPFactory at run time). The settings, for `serve` to print."""
    global _config
    raise_open_file_limit()
    _config = None
    daphne.server.HTTPFactory = EdgeHTTPFactory
    return edge_config()

