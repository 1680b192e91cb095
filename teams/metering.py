"""One request's way through the team's limits and into the ledger, for the API's views.

    meter = RequestMeter(principal, endpoint, request_id)
    meter.check_model(model)        # ModelNotAllowed when the principal may not use it (a 404)
    await meter.admit()             # LimitExceeded before the job is sent: rpm, parallel, spent tokens
    ... job sent, worker's `started` message in hand ...
    await meter.reserve(started, max_tokens, n)   # prompt + the most it may generate, or LimitExceeded
    meter.opened()                  # noted in the journal: a kill of this process still bills it
    meter.handing_on(event)         # a stream's event about to go out: the journal counts it first
    meter.observe(event)            # each event the client was sent: first token, tokens so far, usage
    await meter.finish(status)      # settle to real use, free the slot, queue the ledger row
    await meter.rate_headers()      # OpenAI's x-ratelimit-* headers for the response

`finish` is idempotent and must run however the request ends (also a vanished client or a
dead worker): the tokens the client was sent so far are what gets counted then. A meter made with
`metered=False` (the pages' own `/tokenize`, see `openai_api.tokenization`) checks the model and nothing
else: it neither counts against the limits nor writes a ledger row. Its row is marked `refused`
when the request was turned away without running (see `refusal`): those are counted apart from
served requests in `/v1/key` and the admin.
"""
from __future__ import annotations

import asyncio
import time

from django.utils import timezone

from .errors import ModelNotAllowed
from .ledger import LedgerWriter, UsageEntry
from .limits import LimitExceeded, Ticket, current_headers, limiter, reservation_size, ticket_headers
from .models import hash_key
from .principal import Principal

__all__ = ["LimitExceeded", "RequestMeter", "record_unmetered", "refusal"]
CLIENT_CLOSED = 499


def refusal(status_code: int, completion_tokens: int) -> bool:
    """Turned away without running: a 4xx that generated nothing (the team's 429s, a 403, a 400 the
    worker answered such as a prompt over the context, a model it cannot load), not a client that
    left (499). 5xx are the server's failures and 2xx served: both count as requests."""
    return 400 <= status_code < 500 and status_code != CLIENT_CLOSED and completion_tokens == 0


class RequestMeter:
    def __init__(self, principal: Principal, endpoint: str, request_id: str, model: str = "",
                 hold_row: bool = False, metered: bool = True) -> None:
        self.principal = principal
        self.metered = metered
        self.endpoint = endpoint
        self.request_id = request_id
        self.model = model
        self.started_at = timezone.now()
        self.clock = time.monotonic()
        self.ticket = Ticket.for_scopes(request_id, principal.scopes if metered else (), time.time())
        self.admitted = False
        self.refused = False
        self.prompt_tokens = 0
        self.completion_tokens = 0
        self.usage: dict | None = None
        self.first_token_ms: int | None = None
        self.finish_reasons: list[str] = []
        self.finished = False
        self.tags: dict = {}  # the request's own labels for its ledger row (metadata, user, ...)
        # hold_row: `finish` keeps its row in `row` for the caller to write with its own result, in one
        # transaction (a batch line: a process killed between the two leaves neither, so no line is
        # counted twice); otherwise the ledger writer takes it.
        self.hold_row = hold_row
        self.row: UsageEntry | None = None
        self.journal = None  # noted there from `opened` until `finish` (teams/usage_journal.py)
        self.responding = False  # its response started (a stream's headers went out): for the journal

    def check_model(self, model: str, asked_as: str | None = None) -> None:
        """`model` as resolved (aliases followed); a model it may not use does not exist for it
        (the refusal names it as the client did)."""
        if not self.principal.may_use(model):
            raise ModelNotAllowed(asked_as or model)
        self.model = model

    async def admit(self) -> None:
        if not self.ticket.empty:
            try:
                await limiter().admit(self.ticket)
            except LimitExceeded:
                self.refused = True
                raise
        self.admitted = True

    async def reserve(self, started: dict, max_tokens: int | None, n: int) -> None:
        """Reserve what the job may use, now that the worker has counted the prompt exactly."""
        prompt = started.get("prompt_tokens") or []
        if self.ticket.counts_tokens:
            resolved = started.get("max_tokens", max_tokens)  # the worker resolves a generation job's once
            tokens = reservation_size(prompt, resolved, n, started.get("max_model_len"))
            try:
                await limiter().reserve(self.ticket, tokens)
            except LimitExceeded:
                self.refused = True
                raise
        self.prompt_tokens = sum(prompt)

    def opened(self) -> None:
        """The job has started: from here a kill of this process still leaves the request's row (the journal)."""
        if not self.hold_row:
            self.journal = LedgerWriter.get().journal
            self.journal.opened(self._row(0, "", False))

    def response_started(self) -> None:
        """Its response has started (a stream's status and headers go out): cut off now, it was a 200."""
        self.responding = True
        if self.journal is not None:
            self.journal.noted(self.request_id, self.used[1], self.first_token_ms)

    def handing_on(self, event: dict) -> None:
        """A stream's `event` goes to its client next: the journal has it first, so a kill of this process
        once its frame is in the socket's buffer bills it (the row may then hold one event more than
        arrived, never one less). A whole answer needs none: cut off, its client got no token."""
        if self.journal is None or not self.responding:
            return
        self._count_first_token(event)
        completion = (event["usage"]["completion_tokens"] if "usage" in event
                      else self.used[1] + sum(len(delta.get("token_ids") or ()) for delta in event.get("choices", ())))
        self.journal.noted(self.request_id, completion, self.first_token_ms)

    def observe(self, event: dict) -> None:
        """An event the client was sent: its tokens count."""
        self._count_first_token(event)
        for delta in event.get("choices", ()):
            self.completion_tokens += len(delta.get("token_ids") or ())
            if delta.get("finish_reason"):
                self.finish_reasons.append(delta["finish_reason"])
        if "usage" in event:
            self.usage = event["usage"]

    def _count_first_token(self, event: dict) -> None:
        if self.first_token_ms is None and any(delta.get("token_ids") or delta.get("text")
                                               for delta in event.get("choices", ())):
            self.first_token_ms = int((time.monotonic() - self.clock) * 1000)

    @property
    def used(self) -> tuple[int, int]:
        """(prompt, completion) tokens: the worker's usage when it finished, else what was seen."""
        if self.usage is not None:
            return self.usage["prompt_tokens"], self.usage["completion_tokens"]
        return self.prompt_tokens, self.completion_tokens

    async def rate_headers(self) -> dict[str, str]:
        """OpenAI's x-ratelimit-* headers for this request's response: the counters as its own
        admission left them, or, when it was refused or never admitted (a 429, a 404 for a model
        it may not use), as they stand now."""
        if self.admitted and not self.refused and self.metered:
            return ticket_headers(self.ticket)
        return await current_headers(self.principal.scopes)

    async def finish(self, status_code: int = 200, error_code: str = "", cancelled: bool = False) -> None:
        if self.finished:
            return
        self.finished = True
        if not self.metered:
            return
        prompt, completion = self.used
        row = self._row(status_code, error_code, cancelled)
        if self.hold_row:
            self.row = row
        else:
            try:
                await LedgerWriter.get().record_async(row)  # in the spool before its first await
            finally:
                if self.journal is not None:
                    self.journal.closed(self.request_id)
        if self.admitted and not self.ticket.empty:
            # Shielded: a client that vanishes cancels this task, and the slot must still be freed.
            await asyncio.shield(limiter().settle(self.ticket, self._charged(prompt, completion)))

    def _row(self, status_code: int, error_code: str, cancelled: bool) -> UsageEntry:
        prompt, completion = self.used
        return UsageEntry(
            request_id=self.request_id, created_at=self.started_at, team_id=self.principal.team.pk,
            key_id=self.principal.key.pk if self.principal.key else None,
            key_prefix=self.principal.key.prefix if self.principal.key else "",
            user_id=getattr(self.principal.user, "pk", None), model=self.model, endpoint=self.endpoint,
            prompt_tokens=prompt, completion_tokens=completion, time_to_first_token_ms=self.first_token_ms,
            duration_ms=int((time.monotonic() - self.clock) * 1000), status_code=status_code,
            finish_reason=",".join(sorted(set(self.finish_reasons))), cancelled=cancelled,
            error_code=error_code or "", tags=self.tags,
            refused=self.refused or refusal(status_code, completion),
        )

    def _charged(self, prompt: int, completion: int) -> int:
        return (prompt + completion) if self.ticket.reserved else 0


def record_unmetered(request_id: str, endpoint: str, status_code: int, error_code: str,
                     principal: Principal | None = None, authorization: bytes = b"", model: str = "") -> None:
    """The ledger row of a request answered before it was metered (the database down at its key's lookup,
    the door full): the principal's when known, else its key's hash stands for its key, team and user
    until the ledger writes it (teams.ledger.attribute; a hash of no key's is dropped there)."""
    if principal is not None:
        meter = RequestMeter(principal, endpoint, request_id, model)
        LedgerWriter.get().record(meter._row(status_code, error_code, False))
        return
    words = authorization.split()
    digest = hash_key(words[1].decode("latin-1")) if len(words) == 2 and words[0].lower() == b"bearer" else ""
    LedgerWriter.get().record(UsageEntry(
        request_id=request_id, created_at=timezone.now(), team_id=None, key_id=None, user_id=None, model=model,
        endpoint=endpoint, prompt_tokens=0, completion_tokens=0, time_to_first_token_ms=None, duration_ms=0,
        status_code=status_code, finish_reason="", cancelled=False, error_code=error_code,
        refused=refusal(status_code, 0), key_digest=digest))
