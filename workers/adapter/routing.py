"""Which worker runs a job: a pure choice from the catalog's routing table, claims so it runs once,
and confirmations so a job passed to a dead worker comes back."""
from __future__ import annotations

import asyncio
import hashlib
import random
import time
from collections import OrderedDict
from collections.abc import Container
from typing import NotRequired, TypedDict

import protocol
from protocol import ModelRef

SEEN_JOBS = 10_000
CLAIM_SECONDS = 300


class RoutingTable(TypedDict):
    """As of the last heartbeat (catalog.selectors.routing_table)."""

    loaded: dict[str, list[str]]  # repo id -> channels of the live workers holding it
    free: dict[str, float]  # worker channel -> free MiB
    room: NotRequired[dict[str, int]]  # worker channel -> jobs it can still admit (from its heartbeat)
    beats: NotRequired[dict[str, str]]  # worker channel -> its last heartbeat (compared only with its own)


EMPTY_TABLE: RoutingTable = {"loaded": {}, "free": {}, "room": {}, "beats": {}}


def without_worker(table: RoutingTable, channel: str) -> RoutingTable:
    """The table less a worker that did not confirm a job passed to it (dead since the last heartbeat)."""
    return {"loaded": {repo: [c for c in channels if c != channel] for repo, channels in table["loaded"].items()},
            "free": {c: free for c, free in table["free"].items() if c != channel},
            "room": {c: room for c, room in table.get("room", {}).items() if c != channel},
            "beats": {c: beat for c, beat in table.get("beats", {}).items() if c != channel}}


def choose_worker(ref: ModelRef, here: str, held: Container[str], table: RoutingTable,
                  here_full: bool = False, affinity: str | None = None) -> str | None:
    """Another worker's channel for a job this worker (channel `here`, holding `held`) should not take, else None.

    A worker that holds the model and has room takes it; otherwise a live holder with room (as of its
    last heartbeat; a worker that reported no room is passed over), else — every holder full — the job
    stays with a holder (here if this one holds it) rather than loading another copy, else the worker
    with the most free memory (ties stay here).
    """
    room = table.get("room", {})
    holders = [channel for channel in table["loaded"].get(ref.repo_id, ()) if channel != here]
    if affinity:  # OpenAI's prompt_cache_key: one holder with room per key, so its prefix cache is reused
        candidates = [c for c in holders if room.get(c, 1) > 0] + ([here] if ref.key in held and not here_full else [])
        if candidates:
            chosen = max(candidates, key=lambda channel: _rendezvous(affinity, channel))
            return None if chosen == here else chosen
    if ref.key in held and not here_full:
        return None
    with_room = [channel for channel in holders if room.get(channel, 1) > 0]
    if with_room:
        return random.choice(with_room)
    if ref.key in held:
        return None
    if holders:
        return random.choice(holders)
    free = table["free"]
    if here not in free:
        return None
    best = max(free, key=free.get)
    return best if free[best] > free[here] else None


class JobClaims:
    """Whether this worker may run a job.

    channels_redis can hand one message of a shared channel to two readers
    (django/channels_redis#163), so over Redis a worker first claims the request id (SET NX);
    a forwarded copy of a job this worker already took is dropped the same way.
    """

    def __init__(self, layer, owner: str = "") -> None:
        self.layer = layer
        self.owner = owner  # this worker's channel: the claim names who took the job
        self.taken: OrderedDict[str, None] = OrderedDict()

    def cancelled(self, request_id: str) -> None:
        """The web side gave up on (or cancelled) this job: if it arrives later, it is not run."""
        self._remember(request_id)

    def _remember(self, request_id: str) -> None:
        self.taken[request_id] = None
        if len(self.taken) > SEEN_JOBS:
            self.taken.popitem(last=False)

    async def first_time(self, request_id: str) -> bool:
        if request_id in self.taken:
            return False
        self._remember(request_id)
        connection = getattr(self.layer, "connection", None)
        if connection is None:  # the in-process layer delivers each message once
            return True
        key = self.layer.prefix + protocol.claim_key(request_id)
        return bool(await connection(self.layer.consistent_hash(key)).set(key, self.owner or 1, nx=True,
                                                                            ex=CLAIM_SECONDS))

    async def claimed_by(self, request_id: str) -> str | None:
        """Who claimed the job (a worker's channel, or "cancelled" by the web side), None if nobody yet."""
        connection = getattr(self.layer, "connection", None)
        if connection is None:
            return None
        key = self.layer.prefix + protocol.claim_key(request_id)
        value = await connection(self.layer.consistent_hash(key)).get(key)
        return value.decode() if isinstance(value, bytes) else value


class Unconfirmed:
    """Workers that did not confirm a job passed to them, left out of this worker's choices.

    A worker that did not confirm is dead, or only slow (a busy event loop on a loaded box). It stays
    out until the routing table shows a heartbeat of its own newer than the one seen when it failed
    to confirm — a live worker is back within a beat or two — or until `lost_after` has passed (by then
    the catalog calls a dead worker lost and the table drops it). A live holder wrongly left out for
    the whole of `lost_after` made this worker load a copy of the model itself, and its clients wait
    for that load (seconds) while the holder had room.
    """

    def __init__(self, lost_after: float) -> None:
        self.lost_after = lost_after
        self._left_out: dict[str, tuple[str | None, float]] = {}  # channel -> (its beat then, until when)

    def add(self, channel: str, table: RoutingTable) -> None:
        self._left_out[channel] = (table.get("beats", {}).get(channel), time.monotonic() + self.lost_after)

    def __contains__(self, channel: str) -> bool:
        return channel in self._left_out

    def filter(self, table: RoutingTable) -> RoutingTable:
        """`table` less the workers still left out; those that beat since (or timed out) are let back in."""
        beats, now = table.get("beats", {}), time.monotonic()
        for channel, (beat, until) in list(self._left_out.items()):
            if until < now or (beat is not None and beats.get(channel, beat) != beat):
                del self._left_out[channel]
            else:
                table = without_worker(table, channel)
        return table


class PassedJobs:
    """Jobs this worker passed on, until their receiver confirms them.

    The routing table is as old as the last heartbeat, so the chosen worker may have died
    since; a job it does not confirm within the timeout is run by the worker that passed it.
    A job is expected before it is passed: a live receiver confirms within milliseconds, and a
    confirmation that came before anyone waited for it would be lost, the live worker taken for dead.
    """

    def __init__(self) -> None:
        self._waiting: dict[str, asyncio.Future] = {}

    def expect(self, request_id: str) -> None:
        """Call before passing the job on."""
        self._waiting[request_id] = asyncio.get_running_loop().create_future()

    async def confirmed(self, request_id: str, timeout: float) -> bool:
        future = self._waiting.get(request_id)
        if future is None:
            self.expect(request_id)
            future = self._waiting[request_id]
        try:
            async with asyncio.timeout(timeout):
                await future
            return True
        except TimeoutError:
            return False
        finally:
            if self._waiting.get(request_id) is future:
                del self._waiting[request_id]

    def confirm(self, request_id: str, expected: bool = True) -> None:
        """The receiver has it (`expected=False`: it was never sent after all; stop expecting it)."""
        future = self._waiting.get(request_id) if expected else self._waiting.pop(request_id, None)
        if future is not None and not future.done():
            future.set_result(None)


def _rendezvous(key: str, channel: str) -> int:
    """Highest-random-weight hashing: a key keeps its worker while others come and go."""
    return int.from_bytes(hashlib.blake2b(f"{key}\0{channel}".encode(), digest_size=8).digest(), "big")
